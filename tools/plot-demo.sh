#!/usr/bin/env bash
# tools/plot-demo.sh TIMELINE PNG — draws what `make demo` scraped (TIMELINE: one line per
# scrape, "seconds step loss gpus_desired gpus_current generation", from the operator's and
# rank 0's /metrics) as two panels over time: the training loss, and the GPUs the job wanted
# and held, with each new generation (a rescale) marked. Needs gnuplot (Debian gnuplot-nox).
set -euo pipefail
timeline=$1 png=$2
command -v gnuplot >/dev/null || { echo "plot-demo: gnuplot is not installed (make deps)" >&2; exit 1; }
[[ -s "$timeline" ]] || { echo "plot-demo: $timeline is empty" >&2; exit 1; }
# Where the generation changes (seconds): not where one is first seen, not at a scrape that
# found nothing ("-"). Said for the reader (and the test), drawn as dotted vertical lines.
changes=$(awk '$6 == "-" {next} g != "" && $6 != g {printf "%s ", $1} {g = $6}' "$timeline")
echo "plot-demo: generation changes at: $changes"
arrows=$(for t in $changes; do
  echo "set arrow from $t, graph 0 to $t, graph 1 nohead dt 3 lc rgb \"#888888\""
done)
gnuplot <<GP
set terminal pngcairo size 1000,640 font "sans,11" noenhanced
set output "$png"
set multiplot layout 2,1 title "make demo: a TrainingJob grows 2 -> 4 GPUs when its window opens and shrinks back (scraped every 2 s)"
set grid
set key top right
set lmargin 10
set ylabel "loss"
set format x ""
$arrows
plot "$timeline" using 1:(\$3 > 0 ? \$3 : 1/0) with lines lw 2 lc rgb "#1f77b4" title "loss (rank 0's tidal_worker_loss)"
set format x "%g"
set xlabel "seconds since the job was applied (dotted: a new generation)"
set ylabel "GPUs"
set yrange [0:5]
set ytics 1
plot "$timeline" using 1:4 with steps lw 2 dt 2 lc rgb "#ff7f0e" title "desired", \
     "" using 1:5 with steps lw 3 lc rgb "#2ca02c" title "current"
unset multiplot
GP

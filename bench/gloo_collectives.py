#!/usr/bin/env python3
"""gloo's flat collectives in the torch wheel the engine links, against the fallbacks the
engine used before PyTorch 2.x gave them to gloo (worker/engine/comm.cc): reduce-scatter as an
all-reduce of a copy plus a slice, and the flat all-gather as a list all-gather into views.
Two ranks on loopback (the same ProcessGroupGloo the engine's C++ calls), fp32, each size timed
alternately; prints the ratio native / fallback (< 1: native faster).

  tools/venv/bin/python3 bench/gloo_collectives.py [--mib 16 64] [--rounds 5]"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, port, sizes, rounds, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for mib in sizes:
        n = mib * (1 << 20) // 4 // world * world
        full = torch.randn(n)
        shard = torch.empty(n // world)
        gathered = torch.empty(n)

        def rs_native():
            dist.reduce_scatter_tensor(shard, full)

        def rs_fallback():
            copy = full.clone()
            dist.all_reduce(copy)
            shard.copy_(copy[rank * shard.numel():(rank + 1) * shard.numel()])

        def ag_native():
            dist.all_gather_into_tensor(gathered, shard)

        def ag_fallback():
            dist.all_gather(list(gathered.chunk(world)), shard)

        times = {k: [] for k in ("rs_native", "rs_fallback", "ag_native", "ag_fallback")}
        for _ in range(rounds + 1):  # the first round warms up
            for name, fn in (("rs_native", rs_native), ("rs_fallback", rs_fallback),
                             ("ag_native", ag_native), ("ag_fallback", ag_fallback)):
                dist.barrier()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {k: statistics.median(v[1:]) for k, v in times.items()}
        results[mib] = med
    if rank == 0:
        out.put(results)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, nargs="+", default=[16, 64])
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=run, args=(r, 2, port, a.mib, a.rounds, out)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = out.get()
    for proc in procs:
        proc.join()
    for mib, med in results.items():
        print(json.dumps({
            "mib": mib, "world": 2,
            "reduce_scatter_native_s": med["rs_native"], "reduce_scatter_fallback_s": med["rs_fallback"],
            "reduce_scatter_ratio_native_over_fallback": med["rs_native"] / med["rs_fallback"],
            "all_gather_native_s": med["ag_native"], "all_gather_fallback_s": med["ag_fallback"],
            "all_gather_ratio_native_over_fallback": med["ag_native"] / med["ag_fallback"]}))


if __name__ == "__main__":
    main()

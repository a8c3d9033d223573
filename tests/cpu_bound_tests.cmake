# The tests that keep both cores of the 2-core CI machine busy on their own: multi-process
# training (several ranks, or a `tidal local` cluster whose workers train) measured at 1.2 cores
# or more for 3 s or more, one at a time, on 2026-12-05 (the CPU the whole machine spent while
# each ran, from /proc/stat). Each gets PROCESSORS 2, so `ctest -j2` (tools/test.sh) never runs
# two of them side by side, where each would crawl at half speed against its own timeouts; the
# rest (unit tests, and tests that mostly wait: for a pod, a lease, a process to exit) run in
# pairs. tests/check_cpu_bound_tests.cmake fails when a name here is no test of the build.
# A new test that trains several ranks for seconds belongs here.
set(TIDAL_CPU_BOUND_TESTS
  AutoMicroBatchTest.AnInjectedAllocationFailureIsRetriedSmallerAndTheCurveIsUnchanged  # 4 s, 1.55 cores
  AutoMicroBatchTest.GrowsThenHoldsUnderAnArtificialLimitWithTheFixedSizesLossCurve  # 6 s, 1.53 cores
  ChaosTest.EachFaultKindOnceInASeededOrderBreaksNoInvariant  # 240 s, 1.25 cores
  ChartTest.AOneNamespaceOperatorStillCountsTheGpusPodsOfOtherNamespacesHold  # 3 s, 1.59 cores
  ChartTest.TheChartsRbacGrantsExactlyTheCallsTheOperatorMakes  # 9 s, 1.67 cores
  DrainTest.KubectlDeletePodAndKubectlDrainMoveTheJobOffLiveLosingNoStep  # 49 s, 1.41 cores
  GradientCompressionTest.RatioFivePercentStaysWithinTheMarginAndSendsAFractionOfTheBytes  # 8 s, 1.93 cores
  GradientCompressionTest.RatioOneIsTheUncompressedCurveAtZeroStagesZeroOneAndTwo  # 9 s, 1.66 cores
  GradientCompressionTest.ResumeAndRescaleRestoreTheResidualsAndContinueTheCompressedCurve  # 10 s, 1.73 cores
  GradientCompressionTest.UnderAutoMicroBatchAPassHoldsOneGroupsRowsAndTheCurveIsUnchanged  # 4 s, 1.91 cores
  GradientCompressionTest.WithGroupsFixedTheCompressedCurveIsTheSameAtOneTwoAndFourRanks  # 8 s, 1.72 cores
  GradientCompressionTest.WithoutGroupsARescaleRegroupsTheResidualsSaysSoAndMovesTheCurveByAMeasuredAmount  # 5 s, 1.85 cores
  ModelLoadTest.TwoRanksTrainFromS3AsFromDiskEachReadingAboutHalf  # 4 s, 1.40 cores
  ObservabilityTest.ALossMadeToRisePausesItsJobAndANoisyLossDoesNot  # 18 s, 1.86 cores
  ObservabilityTest.PrometheusScrapesTheJobAndEveryDashboardQueryAndAlertRuleRunsOnIt  # 13 s, 1.46 cores
  OperatorFailoverTest.APoisonSpecIsRefusedAndAStoredOneStopsNeitherTheOperatorNorAJob  # 10 s, 1.63 cores
  OperatorFailoverTest.KillingTheLeaderMidRescaleLetsTheNextOneFinishItWithoutASecondGeneration  # 44 s, 1.45 cores
  OperatorTest.JobsThatCannotStartAreRefusedNamingTheFieldAndAnEditOfTheSpecStartsThemAgain  # 5 s, 1.38 cores
  OperatorTest.KillNineOfAWorkerIsRebuiltFromItsBuddysCopyLosingAtMostOneStep  # 30 s, 1.42 cores
  OperatorTest.KubectlScaleResizesARunningJobWithoutChangingItsLossCurve  # 39 s, 1.42 cores
  OperatorTest.StatusFollowsTheWorkersStepWithinTwoSecondsAndASteadyJobCostsNoReconcile  # 22 s, 1.56 cores
  OperatorTest.SuspendCheckpointsAndRemovesThePodsAndResumeContinuesFromThatStep  # 4 s, 1.55 cores
  OperatorTest.TheCapacityGateHoldsAJobAtMinAndAPendingScaleUpIsAbandoned  # 65 s, 1.52 cores
  OperatorTest.WithATlsSecretTheOperatorDrivesItsWorkersOverVerifiedTls  # 5 s, 1.75 cores
  ShiftedClockTest.AScheduleWindowInTheJobsTimeZoneGrowsTheJobWhenItOpensAndShrinksItAtItsEnd  # 24 s, 1.57 cores
  TrainCliTest.EveryZeroStageGivesTheSameLossesOnTwoRanks  # 10 s, 1.55 cores
  TrainCliTest.LossesAgreeAcrossOneTwoAndFourRanks  # 13 s, 1.55 cores
  TrainCliTest.TinyExampleLossFallsBelowSixtyPercentOfTheFirstStepIn200Steps  # 23 s, 1.99 cores
  TrainResumeTest.AFullDiskFailsTheSaveWithItsErrorAndLeavesTheLastCheckpointWhole  # 3 s, 1.49 cores
  TrainResumeTest.AnAutomaticIntervalIsPlannedFromEachCheckpointsMeasuredCostAndResumed  # 11 s, 1.36 cores
  TrainResumeTest.FullCheckpointAtThreeRanksResumesAtTwoAndFourWithTheSameLosses  # 27 s, 1.35 cores
  TrainResumeTest.KillNineOfARankDuringAsyncSavesLeavesTheLastCommittedOneLoadable  # 12 s, 1.34 cores
  TrainResumeTest.ResumeFromAnotherUriContinuesTheCurveAndSavesOnlyWhereTold  # 7 s, 1.33 cores
  TrainResumeTest.SavesToS3AndResumesFromItAtAnotherWorldSizeOnTheReferenceCurve  # 20 s, 1.31 cores
  TrainResumeTest.TheFilesSpecCheckpointIsHonouredWithoutFlagsAndFlagsOverrideIt  # 9 s, 1.33 cores
  TrainResumeTest.TornAndCorruptCheckpointsFallBackToThePreviousOne  # 13 s, 1.36 cores
  TrainResumeTest.ZeroThreeCheckpointResumesAtZeroZeroAndBack  # 8 s, 1.59 cores
  WorkerControlTest.ASupersededGenerationStopsAtOnceAndNeverCommitsBesideItsSuccessor  # 6 s, 1.29 cores
)

# Included by CTest after the discovered GoogleTest lists: tests that compare timings run alone,
# with no other test sharing the cores.
set_tests_properties(Cli.DoctorPerfStepRateIsBenchs PROPERTIES RUN_SERIAL TRUE)

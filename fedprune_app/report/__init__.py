"""What a run reports: results.md's tables and the broken-model judgement (`tables`), the plots
(`plots`), TensorBoard (`board`), and the run directory that writes them (`run.ReportedRun`). The
core renders nothing; a method adds its own sections through `tables.MethodReport`."""

"""What a job records for the init report: the recorder (what the cache did), the init phases,
the ledger (where the rest of init went), the files a step factory read, MLPerf's lines."""

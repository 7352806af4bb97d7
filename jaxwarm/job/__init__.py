"""Everything that runs inside a job process: the start (`start/`), the recorder and the books
of the init report (`record/`), the ranks' meetings, prefetch, staging, the one warm decision,
and the prewarm and verify jobs. It never imports the submit side or the CLI."""

"""Answer verifiers that run outside the calling thread: a process pool with per-item deadlines,
and the scoring functions it runs (math-verify). Importing this package imports neither torch nor
the verifiers' libraries, so the pool's worker processes start light."""

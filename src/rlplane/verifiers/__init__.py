"""Answer verifiers run in a process pool with per-item deadlines; importing this imports neither torch nor them."""

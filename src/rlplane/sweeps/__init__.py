"""``rlplane sweep``: one preset or config over seeds, numeric variants and a control, each run an ordinary run
directory, summarised as a distribution (mean, sd, worst, best) beside its control."""

"""The strategies: everything that makes `--strategy X` true — their declarative files and shipped configs, the
process-group set-up and CPU routes the libraries get wrong, the comm hooks, and the start-up proofs."""

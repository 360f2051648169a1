"""The operator's decisions, pure: `decide(observed) -> Decision`, failure detection, restart
budgets, goodput and the explanation of a failure. Imports `types` only; never I/O.
"""

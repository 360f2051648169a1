"""The operator's decisions, pure: `decide(observed) -> Decision` (decide.py wires the policies,
one per module: track, conditions, launch, failure, spares, inplace, finish; accounting keeps
the books), failure detection, restart budgets, goodput and the explanation of a failure.
Imports `types` only; never I/O, and reads nothing that is not parsed already (io/reports.py).
"""

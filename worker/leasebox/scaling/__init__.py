"""How many workers a backlog needs: the pure policy, and a simulation that exercises it.

The policy is a pure function shared by the operator, the demo and `leasebox simulate`; it
imports nothing that does I/O.
"""

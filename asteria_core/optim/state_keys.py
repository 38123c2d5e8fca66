"""The keys of a parameter's optimizer state that SOAP, Shampoo and KL-Shampoo share.

Block entries are nested [dim][chunk] as the parameter's layout (layout.py) nests its blocks: a
dim that is not preconditioned holds None.
"""

STEP = "step"                # int: steps that updated this parameter (the first call does not)
EXP_AVG = "exp_avg"          # first moment, original basis, work shape
FACTORS = "factors"          # [dim][chunk] (b, b) factor statistics
BASES = "bases"              # [dim][chunk] (b, b) basis in use (Shampoo: inverse root)
VERSIONS = "basis_versions"  # [dim][chunk] int: swaps so far (0: initial identity)
BASIS_STEPS = "basis_steps"  # [dim][chunk] int: stats step behind the basis in use (-1: none)

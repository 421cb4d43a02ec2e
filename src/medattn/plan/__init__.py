"""A training plan from the data's fingerprint (nnU-Net's and nnMIL's habit): ``medattn plan CONFIG`` prints it,
``medattn train`` and ``compare`` apply it to the keys a config leaves null and record it (config.yaml's comment
lines, the summary, results.json ``plan``).

>>> found = fingerprint(bundle)
>>> decisions = plan(config, found)
>>> config = apply(config, decisions)
"""

from .fingerprint import fingerprint
from .rules import Decision, apply, as_records, describe, plan

__all__ = ["Decision", "apply", "as_records", "describe", "fingerprint", "plan"]

"""The realistic development benchmark: real anatomy (nilearn's MNI152, scikit-image's IHC image) with
SYNTHETIC findings, written in the users' formats (docs/realistic.md). Defaults are chosen here, not on the
phantoms alone."""

from .tasks import SPLITS, TASKS, make_task

__all__ = ["SPLITS", "TASKS", "make_task"]

"""What every recipe composes: the session's parts and the building blocks of an on-policy step."""

from rlplane.training.loop import Timer, TrainingStopped
from rlplane.training.session import Session

__all__ = ["Session", "Timer", "TrainingStopped"]

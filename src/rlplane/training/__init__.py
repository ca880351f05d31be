"""What every recipe composes: the session's parts and the building blocks of an on-policy step."""

from rlplane.training.components import Components
from rlplane.training.loop import DataExhausted, Timer, TrainingStopped
from rlplane.training.session import Session

__all__ = ["Components", "DataExhausted", "Session", "Timer", "TrainingStopped"]

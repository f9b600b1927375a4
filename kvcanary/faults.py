"""``kvcanary.faults``: the fault injectors and fault schedules under one name, for engines' own tests.

The public face of two testing aids: :mod:`kvcanary.testing.faults` (the injectors, their target finders,
:data:`FAULTS`) and :mod:`kvcanary.testing.schedule` (:class:`FaultSchedule`, random faults with a detection
bound, which looks faults up in the first). The schedule imports the injectors and not the other way round;
this module gathers both names. ``from kvcanary.faults import FaultSchedule, remap_req_to_token`` and
``kvcanary.faults.FAULTS`` both work.
"""

from kvcanary.testing import faults as _injectors
from kvcanary.testing.faults import *  # noqa: F403  (the injectors' public names, as listed in their __all__)
from kvcanary.testing.schedule import FaultNotDetectedError, FaultSchedule, ScheduledFault

__all__ = [*_injectors.__all__, "FaultNotDetectedError", "FaultSchedule", "ScheduledFault"]

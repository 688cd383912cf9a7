"""Whether the computer runs on battery, for idle learning (it waits for mains power
unless the user lets it learn on battery). Read from psutil's battery sensor."""

from __future__ import annotations

from collections.abc import Callable

# True on battery, False on mains power, None where no battery is sensed.
PowerSensor = Callable[[], "bool | None"]

BATTERY_STATUS = "paused on battery"  # the learning state the status bar shows


def on_battery() -> bool | None:
    """psutil's battery sensor: None on a desktop, or where psutil cannot read one."""
    import psutil

    sensor = getattr(psutil, "sensors_battery", None)  # not on every platform
    try:
        battery = sensor() if sensor is not None else None
    except Exception:  # noqa: BLE001 - a sensor that fails to read is no sensor
        return None
    if battery is None or battery.power_plugged is None:
        return None
    return not battery.power_plugged


def no_sensor() -> bool | None:
    return None

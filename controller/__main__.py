"""``python -m spotray.controller``: run the TrainingRun and TrainingSweep operator (what the chart's Deployment runs).

Settings come from the environment (controller/config.py). With SPOTRAY_NAMESPACES empty it
watches every namespace; with SPOTRAY_PEERING set, replicas elect one active instance through kopf
peering (the chart installs the peering CRDs), otherwise it runs standalone.
"""

from __future__ import annotations

import logging
import secrets
import sys

from spotray.contract.attempts import EXIT_BAD_INPUT, EXIT_OK
from spotray.contract.errors import SpotrayError
from spotray.contract.extras import MissingExtraError, extra_required


def main() -> int:
    from spotray.controller.config import ControllerConfig  # noqa: PLC0415 - parse settings before anything else

    try:
        config = ControllerConfig.from_env()
        with extra_required("controller"):
            import kopf  # noqa: PLC0415 - after the settings, so a bad setting is reported first

            import spotray.controller.handlers  # noqa: F401, PLC0415 - registers the handlers with kopf
    except (SpotrayError, MissingExtraError) as error:
        print(f"spotray controller: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    log_format = kopf.LogFormat.JSON if config.log_format == "json" else kopf.LogFormat.PLAIN
    kopf.configure(verbose=False, log_format=log_format)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    # kopf logs every handler and timer run ("Timer 'on_timer' succeeded.") at INFO: one line per
    # run per second. Our own log says what changed; kopf's warnings and errors still show.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        standalone=config.peering is None,
        peering_name=config.peering,
        # kopf pauses every peer when two share a priority: each replica takes its own, and the
        # highest one alive does the work.
        priority=secrets.randbelow(1_000_000) + 1 if config.peering else None,
        liveness_endpoint=f"http://0.0.0.0:{config.health_port}/healthz",
    )
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())

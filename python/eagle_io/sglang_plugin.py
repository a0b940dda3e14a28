"""The ``sglang.srt.plugins`` entry point (``pyproject.toml``): SGLang's ``load_plugins`` calls :func:`register` in
every process that loads plugins. It registers the serving guard (:func:`eagle_io.serving.plugin.register`) and hands
it the SGLang capture's hook installer (:func:`eagle_io.capturing.sglang.scheduler.install`), so neither room imports
the other (tests/test_import_floors.py)."""

from __future__ import annotations

from .serving import plugin


def _install_capture(switch: str) -> list[str]:
    """The SGLang capture's scheduler hooks, registered (imported only where a ``Scheduler`` is hosted: the guard calls
    this after checking that); returns the targets hooked."""
    from .capturing.sglang import scheduler

    return scheduler.install(switch=switch)


def register() -> None:
    """Registers the startup guard and the SGLang capture's hooks (see :func:`eagle_io.serving.plugin.register`)."""
    plugin.register(install_capture=_install_capture)

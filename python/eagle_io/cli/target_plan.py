"""Where ``eagle-io generate`` runs its target, said before it runs: the backend, the device, the dtype and the memory
the weights need against what is available there; a target that cannot fit is refused with the figures before
anything loads or launches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["hf_plan", "sglang_plan"]


def _weights(model: str | None) -> Path:
    from ..capturing.models import default_gguf_path

    return Path(model).expanduser() if model else default_gguf_path()


def _countable(path: Path) -> bool:
    """A GGUF file or a directory with safetensors headers: what the weights' size can be counted from."""
    return path.is_file() or any(path.glob("*.safetensors"))


def hf_plan(model: str | None, dtype: str) -> None:
    """Prints the ``where`` line of ``--backend hf``: transformers runs the whole target in this process, on the
    CPU, in ``dtype``, and the memory its weights need against what is available.

    Raises:
        InvalidArgumentError: its weights at ``dtype`` need more than the memory available (the figures, and
            ``--backend sglang`` / ``--server``), after the line is printed.
    """
    from ..capturing.weights import require_fits, whole_model_need

    path = _weights(model)
    where = "where     --backend hf: transformers runs the whole target in this process, on the CPU"
    if not path.exists() or not _countable(path):
        print(f"{where}, as {dtype} (weights' size not counted: no safetensors or GGUF headers)")
        return
    need = whole_model_need(path, dtype, "cpu")
    print(f"{where}: {need.describe()}", flush=True)
    require_fits(need, "--backend hf loads the whole target in this process")


def sglang_plan(model: str | None, engine_args: dict[str, Any]) -> None:
    """Prints the ``where`` line of ``--backend sglang``: SGLang's server holds the weights as stored, split over
    ``tp_size`` GPUs, ``dp_size`` copies (``tp_size x dp_size`` GPUs), or in host memory with ``device=cpu``; and
    what each GPU has free (``nvidia-smi``).

    Raises:
        InvalidArgumentError: fewer GPUs visible than the launch takes, or a GPU's share of the weights more than the
            least free memory of those GPUs (host memory with ``device=cpu``), after the line is printed.
    """
    from ..capturing.weights import require_fits, whole_model_need
    from ..host import gpu_memory, human_bytes

    path = _weights(model)
    tp, dp = int(engine_args.get("tp_size", 1)), int(engine_args.get("dp_size", 1))
    cpu = engine_args.get("device") == "cpu"
    launch = f"where     --backend sglang: sglang.launch_server, tp {tp} x dp {dp}"
    if not path.exists() or not _countable(path):
        print(f"{launch} (weights' size not counted: no safetensors or GGUF headers)")
        return
    need = whole_model_need(path, None, "cpu")
    if cpu:  # every data-parallel replica holds the whole model in host memory
        need = replace(need, need=need.need * dp)
        print(f"{launch} on the CPU: {need.describe()}", flush=True)
        require_fits(need, f"--backend sglang with device=cpu holds the whole target in host memory, {dp} time(s)")
        return
    gpus = gpu_memory()
    per_gpu = need.need / tp
    weights = f"{need.params / 1e9:,.2f} B parameters, {human_bytes(need.need)} as stored"
    weights += f", {human_bytes(per_gpu)} per GPU"
    if gpus is None:
        print(f"{launch} on {tp * dp} GPU(s): {weights}; GPU memory not known here (no nvidia-smi)")
        return
    free = min((f for f, _ in gpus[: tp * dp]), default=0)
    print(f"{launch} on {tp * dp} GPU(s): {weights}; {len(gpus)} visible, the least free of them {human_bytes(free)}",
          flush=True)  # fmt: skip
    if len(gpus) < tp * dp:
        raise InvalidArgumentError(
            f"--backend sglang with --tp-size {tp} --dp-size {dp} takes {tp * dp} GPUs, {len(gpus)} visible here: "
            "lower --dp-size, or capture through servers on other machines with --server URL"
        )
    if per_gpu > free:
        raise InvalidArgumentError(
            f"--backend sglang with --tp-size {tp}: {weights}, more than the {human_bytes(free)} free on the least "
            f"free of its {tp * dp} GPUs: it cannot fit; raise --tp-size (a GPU then holds 1/tp of the weights), or "
            "capture through servers launched elsewhere with --server URL"
        )

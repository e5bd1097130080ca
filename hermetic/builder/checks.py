"""Build-time checks that every wheel runs on the base and its Python (rules: hermetic.gpu.wheels)."""

from __future__ import annotations

from hermetic.config.load import LoadedConfig
from hermetic.gpu.cuda import cuda_info
from hermetic.gpu.findings import raise_for_failures, warnings
from hermetic.gpu.wheels import build_checks
from hermetic.lock.model import ResolvedWheel


def run_build_checks(cfg: LoadedConfig, wheels: list[ResolvedWheel], facts) -> list[str]:
    """Raises on the first incompatibility (naming the package); returns warnings."""
    findings = build_checks(cuda_info(wheels), [w.filename for w in wheels],
                            glibc=facts.glibc, python_version=cfg.model.python.version)
    raise_for_failures(findings)
    return [f.message for f in warnings(findings)]

"""Accelerator catalog: peak FLOP/s, HBM, and the two networks around each chip.

Every number is per chip unless its name says otherwise, in SI units (FLOP/s, bytes,
bytes/s), with its source next to it. Bandwidths follow the convention of "How to
Scale Your Model" (jax-ml/scaling-book): a bandwidth is what one chip can *send*
(egress) to the collective, so a ring all-reduce of V bytes over X chips takes
``2 (X-1)/X * V / W``.

* ``ici_bandwidth``: intra-slice network (TPU ICI, GPU NVLink), egress of one chip
  along one data-parallel axis. On a TPU torus that is two links (both neighbours) of
  the one-way link bandwidth, which the book calls the "bidirectional" W_ICI; on a GPU
  it is the NVLink egress of one GPU into the NVSwitch fabric.
* ``dcn_bandwidth_per_host``: cross-slice network (TPU DCN, GPU InfiniBand or
  Ethernet), egress of one host, shared by its ``chips_per_host`` chips.

Numbers marked ASSUMED were not found in a public source; pass your own
:class:`HardwareSpec` (or ``dataclasses.replace`` one of these) when you know better.
"""

from __future__ import annotations

import dataclasses

_GIB = 2**30


@dataclasses.dataclass(frozen=True)
class HardwareSpec:
  """One accelerator and its networks; all rates are per chip unless named per host.

  Users can build their own, e.g. ``dataclasses.replace(HARDWARE["v5p"],
  dcn_bandwidth_per_host=1e11)``.
  """

  name: str  # display name
  peak_flops: float  # dense bf16 FLOP/s per chip (no sparsity)
  hbm_bytes: float  # HBM capacity per chip, bytes
  hbm_bandwidth: float  # HBM bandwidth per chip, bytes/s
  ici_bandwidth: float  # intra-slice (ICI / NVLink) egress per chip along one DP axis, bytes/s
  dcn_bandwidth_per_host: float  # cross-slice (DCN / InfiniBand) egress per host, bytes/s
  chips_per_host: int  # chips behind one host's network cards
  # The HBM bandwidth a bandwidth-bound op was measured to reach on one chip, bytes/s, and where
  # it was measured (None: not measured here). The calculator's figures use ``hbm_bandwidth``
  # (the spec sheet's, the scaling book's convention); :meth:`hbm_for` gives either.
  hbm_bandwidth_achievable: float | None = None
  hbm_achievable_source: str = ""

  def __post_init__(self):
    fields = ("peak_flops", "hbm_bytes", "hbm_bandwidth", "ici_bandwidth", "dcn_bandwidth_per_host")
    for field in fields + (("hbm_bandwidth_achievable",) if self.hbm_bandwidth_achievable is not None else ()):
      value = getattr(self, field)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"HardwareSpec.{field} must be a positive number, got {value!r}.")
    if self.hbm_bandwidth_achievable is not None and not self.hbm_achievable_source:
      raise ValueError("HardwareSpec.hbm_achievable_source must say where hbm_bandwidth_achievable was measured.")
    if (not isinstance(self.chips_per_host, int) or isinstance(self.chips_per_host, bool)
        or self.chips_per_host <= 0):
      raise ValueError(
          f"HardwareSpec.chips_per_host must be a positive integer, got {self.chips_per_host!r}.")

  def hbm_for(self, which: str = "spec") -> float:
    """The HBM bandwidth of the spec sheet (``"spec"``, what the calculator uses) or the one
    measured on a chip (``"achievable"``), bytes/s; a one-line error where none was measured.

    Examples:
      >>> HARDWARE["v5e"].hbm_for("spec") / 1e9, round(HARDWARE["v5e"].hbm_for("achievable") / 1e9)
      (810.0, 651)
      >>> HARDWARE["v5p"].hbm_for("achievable")
      Traceback (most recent call last):
      ...
      ValueError: TPU v5p has no measured achievable HBM bandwidth in the catalog; use which='spec' (its spec sheet's 2.765e+12 B/s).
    """
    if which == "spec":
      return self.hbm_bandwidth
    if which != "achievable":
      raise ValueError(f"which must be one of ('spec', 'achievable'), got {which!r}.")
    if self.hbm_bandwidth_achievable is None:
      raise ValueError(f"{self.name} has no measured achievable HBM bandwidth in the catalog; use"
                       f" which='spec' (its spec sheet's {self.hbm_bandwidth:.4g} B/s).")
    return self.hbm_bandwidth_achievable

  @property
  def dcn_bandwidth(self) -> float:
    """The host's cross-slice egress bandwidth divided among its chips, in bytes/s."""
    return self.dcn_bandwidth_per_host / self.chips_per_host


HARDWARE: dict[str, HardwareSpec] = {
    # --- Google TPUs. [book] = jax-ml/scaling-book tpus.md (TPU specs table and the
    # "DCN bandwidth ... per TPU" paragraph); [gcp] = cloud.google.com/tpu/docs/<version>.
    "v4": HardwareSpec(
        name="TPU v4",
        peak_flops=2.75e14,  # [gcp v4] 275 TFLOP/s bf16 per chip
        hbm_bytes=32 * _GIB,  # [gcp v4] 32 GiB HBM2
        hbm_bandwidth=1.2e12,  # [gcp v4] 1,200 GBps
        ici_bandwidth=2 * 4.5e10,  # [book] v4p ICI 4.5e10 B/s one-way per link, x2 links per axis
        dcn_bandwidth_per_host=4 * 6.25e9,  # ASSUMED: v5p's 6.25e9 B/s per chip (50 Gbps) x 4
        chips_per_host=4,  # [book] host size 2x2x1
    ),
    "v5e": HardwareSpec(
        name="TPU v5e",
        peak_flops=1.97e14,  # [gcp v5e] 197 TFLOP/s bf16
        hbm_bytes=16e9,  # [gcp v5e] 16 GB
        hbm_bandwidth=8.1e11,  # [book] 8.1e11 B/s ([gcp v5e] lists 800 GiBps = 8.6e11)
        ici_bandwidth=2 * 4.5e10,  # [book] 4.5e10 B/s one-way per link, x2 links per axis
        dcn_bandwidth_per_host=2.5e10,  # [gcp v5e] 2 x 100 Gbps NICs per host ([book] 3.125e9/chip)
        chips_per_host=8,  # [gcp v5e] 8 chips per host (4x2)
        # Measured: benchmarks/roofline.py's elementwise x + 1 on one v5e (JAX 0.10.2), stored in
        # analysis/results/tpu-v5-lite-roofline.json; tests/test_accelerator_results.py checks
        # that this is the stored measurement. 80% of the spec sheet's 8.1e11.
        hbm_bandwidth_achievable=6.509e11,
        hbm_achievable_source="measured by benchmarks/roofline.py (x + 1) on one TPU v5e, "
                              "analysis/results/tpu-v5-lite-roofline.json",
    ),
    "v5p": HardwareSpec(
        name="TPU v5p",
        peak_flops=4.59e14,  # [gcp v5p] 459 TFLOP/s bf16
        hbm_bytes=95 * _GIB,  # [gcp v5p] 95 GiB HBM2e
        hbm_bandwidth=2.765e12,  # [gcp v5p] 2,765 GBps ([book] 2.8e12)
        ici_bandwidth=2 * 9e10,  # [book] 9e10 B/s one-way per link, x2 = the book's W_ICI 1.8e11
        dcn_bandwidth_per_host=4 * 6.25e9,  # [gcp v5p] DCN 50 Gbps per chip = [book] 6.25e9 B/s
        chips_per_host=4,  # [gcp v5p] 4-chip VM, host 2x2x1
    ),
    "v6e": HardwareSpec(
        name="TPU v6e (Trillium)",
        peak_flops=9.18e14,  # [gcp v6e] 918 TFLOP/s bf16
        hbm_bytes=32e9,  # [gcp v6e] 32 GB
        hbm_bandwidth=1.638e12,  # [gcp v6e] 1,638 GBps
        ici_bandwidth=2 * 9e10,  # [book] 9e10 B/s one-way per link, x2 links per axis
        dcn_bandwidth_per_host=8 * 12.5e9,  # [book] 12.5e9 B/s DCN per TPU for v6e
        chips_per_host=8,  # [gcp v6e] 8 chips per host
    ),
    "tpu7x": HardwareSpec(
        name="TPU7x (Ironwood)",
        peak_flops=2.307e15,  # [gcp tpu7x] 2,307 TFLOP/s bf16 (4,614 fp8)
        hbm_bytes=192 * _GIB,  # [gcp tpu7x] 192 GiB
        hbm_bandwidth=7.37e12,  # Google Cloud blog "Ironwood" (Apr 2025): 7.37 TB/s per chip
        ici_bandwidth=2 * 9e10,  # ASSUMED as v5p: same 1.2 TB/s nominal bidirectional ICI per chip
        dcn_bandwidth_per_host=4 * 6.25e9,  # ASSUMED as v5p (50 Gbps per chip); not published
        chips_per_host=4,  # [gcp tpu7x] 4-chip VMs (tpu7x-standard-4t)
    ),
    # --- NVIDIA GPUs (SXM). [nv] = NVIDIA product datasheets (dense, i.e. without
    # sparsity); [gpus] = jax-ml/scaling-book gpus.md (NVLink table: 25 GB/s per link
    # per direction, 12 links on A100, 18 on H100/H200, 18 x 50 GB/s on B200; one
    # 400 Gbps CX7 NIC per GPU in a DGX H100).
    "a100": HardwareSpec(
        name="NVIDIA A100 80GB SXM",
        peak_flops=3.12e14,  # [nv A100] 312 TFLOP/s bf16 dense
        hbm_bytes=80e9,  # [nv A100] 80 GB HBM2e
        hbm_bandwidth=2.039e12,  # [nv A100] 2,039 GB/s
        ici_bandwidth=3.0e11,  # [gpus] NVLink 3: 12 x 25 GB/s egress (600 GB/s bidirectional)
        dcn_bandwidth_per_host=8 * 25e9,  # [nv DGX A100] 8 x 200 Gb/s HDR InfiniBand
        chips_per_host=8,  # DGX/HGX A100: 8 GPUs per node
    ),
    "h100": HardwareSpec(
        name="NVIDIA H100 SXM",
        peak_flops=9.89e14,  # [nv H100] 989 TFLOP/s bf16 dense (1,979 with sparsity)
        hbm_bytes=80e9,  # [nv H100] 80 GB HBM3
        hbm_bandwidth=3.35e12,  # [nv H100] 3.35 TB/s
        ici_bandwidth=4.5e11,  # [gpus] NVLink 4: 18 x 25 GB/s egress (900 GB/s bidirectional)
        dcn_bandwidth_per_host=8 * 50e9,  # [gpus] 8 x 400 Gbps CX7 NICs per DGX H100 node
        chips_per_host=8,
    ),
    "h200": HardwareSpec(
        name="NVIDIA H200 SXM",
        peak_flops=9.89e14,  # [nv H200] 989 TFLOP/s bf16 dense, same die as H100
        hbm_bytes=141e9,  # [nv H200] 141 GB HBM3e
        hbm_bandwidth=4.8e12,  # [nv H200] 4.8 TB/s
        ici_bandwidth=4.5e11,  # [gpus] NVLink 4, as H100
        dcn_bandwidth_per_host=8 * 50e9,  # [nv DGX H200] 8 x 400 Gb/s ConnectX-7
        chips_per_host=8,
    ),
    "b200": HardwareSpec(
        name="NVIDIA B200",
        peak_flops=2.25e15,  # [gpus] 2.25e15 bf16 dense ([nv HGX B200] 4.5 PFLOP/s with sparsity)
        hbm_bytes=180e9,  # [nv DGX B200] 1,440 GB for 8 GPUs ([gpus] lists 192 GB physical)
        hbm_bandwidth=8.0e12,  # [nv DGX B200] 64 TB/s for 8 GPUs
        ici_bandwidth=9.0e11,  # [gpus] NVLink 5: 18 x 50 GB/s egress (1.8 TB/s bidirectional)
        dcn_bandwidth_per_host=8 * 50e9,  # [nv DGX B200] 8 x 400 Gb/s ConnectX-7
        chips_per_host=8,
    ),
}

_ALIASES = {"ironwood": "tpu7x", "v7x": "tpu7x", "trillium": "v6e", "v4p": "v4"}


def get_hardware(hardware: str | HardwareSpec) -> HardwareSpec:
  """Returns the catalog entry called ``hardware`` (case-insensitive), or ``hardware`` itself.

  Args:
    hardware: a key of ``HARDWARE`` (or an alias: ironwood, v7x, trillium, v4p), or a
      :class:`HardwareSpec`, which is returned unchanged.

  Returns:
    The :class:`HardwareSpec`.

  Examples:
    >>> get_hardware("v5p").dcn_bandwidth  # bytes/s of DCN egress per chip
    6250000000.0
    >>> get_hardware("Ironwood").name
    'TPU7x (Ironwood)'
  """
  if isinstance(hardware, HardwareSpec):
    return hardware
  key = str(hardware).lower()
  key = _ALIASES.get(key, key)
  if key not in HARDWARE:
    raise ValueError(f"hardware must be one of {sorted(HARDWARE)}, got {hardware!r}.")
  return HARDWARE[key]


_DEVICE_KINDS = (  # substrings of jax.Device.device_kind, most specific first
    ("h200", "h200"), ("h100", "h100"), ("a100", "a100"), ("b200", "b200"),
    ("v5 lite", "v5e"), ("v5e", "v5e"), ("v5p", "v5p"), ("tpu v5", "v5p"),
    ("v6 lite", "v6e"), ("v6e", "v6e"), ("tpu7x", "tpu7x"), ("tpu v7", "tpu7x"), ("tpu v4", "v4"),
)


def hardware_for_device_kind(device_kind: str) -> HardwareSpec | None:
  """The catalog entry of a JAX device (``jax.devices()[0].device_kind``), or None if unknown.

  Args:
    device_kind: e.g. ``"NVIDIA H200"``, ``"TPU v5 lite"`` (a v5e), ``"cpu"``.

  Returns:
    The :class:`HardwareSpec`, or None (CPUs and chips not in :data:`HARDWARE`).

  Examples:
    >>> hardware_for_device_kind("NVIDIA H100 80GB HBM3").name
    'NVIDIA H100 SXM'
    >>> hardware_for_device_kind("TPU v5 lite").peak_flops
    197000000000000.0
    >>> hardware_for_device_kind("cpu") is None
    True
  """
  kind = str(device_kind).lower()
  return next((HARDWARE[key] for sub, key in _DEVICE_KINDS if sub in kind), None)


def check_hardware(hardware) -> HardwareSpec:
  """``hardware`` if it is a :class:`HardwareSpec`; else a one-line ValueError.

  The calculator's functions take resolved specs; :func:`get_hardware` resolves a catalog
  name once, at the entry point (:func:`analysis.planning.plan.plan_run`, the command line).

  Examples:
    >>> check_hardware("v5p")
    Traceback (most recent call last):
    ...
    ValueError: hardware must be a HardwareSpec (analysis.get_hardware resolves a catalog name), got 'v5p'.
  """
  if not isinstance(hardware, HardwareSpec):
    raise ValueError(f"hardware must be a HardwareSpec (analysis.get_hardware resolves a "
                     f"catalog name), got {hardware!r}.")
  return hardware

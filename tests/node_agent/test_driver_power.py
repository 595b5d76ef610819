"""Driver, CUDA and power-limit facts: the pynvml adapter, the simulation, reading them, the flags."""

from __future__ import annotations

import pytest

from node_agent.config import parse_args
from node_agent.sources.driver_power import read_driver, read_power
from node_agent.sources.nvml_pynvml import PynvmlReader
from node_agent.sources.nvml_reader import (
    NvmlReadError,
    PowerLimits,
    cuda_version_text,
    parse_cuda_version,
)
from node_agent.sources.nvml_simulated import SimulatedNvml, simulated_power
from node_agent.sources.opening import open_sources
from tests.node_agent.fake_pynvml import (
    GPU_IS_LOST,
    NO_PERMISSION,
    NOT_SUPPORTED,
    UNKNOWN,
    FakeGpu,
    FakePynvml,
)
from tests.support.machines import catalog_machine


def _reader(*gpus: FakeGpu) -> tuple[PynvmlReader, FakePynvml]:
    fake = FakePynvml(list(gpus) or [FakeGpu("GPU-a"), FakeGpu("GPU-b", bus="00000000:0F:00.0")])
    return PynvmlReader.open(fake, cpu_count=8, watch_events=False), fake


# ---------------------------------------------------------------------- pynvml: driver and CUDA


@pytest.mark.timeout(10)
def test_pynvml_reads_the_cuda_version_the_driver_runs():
    """nvmlSystemGetCudaDriverVersion_v2's 12040 is CUDA "12.4", beside the driver's "550.54.15"."""
    reader, fake = _reader()
    assert (reader.driver_version(), reader.cuda_driver_version()) == ("550.54.15", "12.4")
    fake.cuda_version = 11080
    assert reader.cuda_driver_version() == "11.8"
    assert "nvmlSystemGetCudaDriverVersion" not in fake.calls  # the _v2 call answered


@pytest.mark.timeout(10)
def test_pynvml_falls_back_to_the_original_cuda_call():
    """A binding or driver without the _v2 call is asked with the original one."""
    reader, fake = _reader()
    fake.fail["nvmlSystemGetCudaDriverVersion_v2"] = AttributeError("no such function")
    fake.cuda_version = 12020
    assert reader.cuda_driver_version() == "12.2"


@pytest.mark.timeout(10)
@pytest.mark.parametrize("code", [NOT_SUPPORTED, NO_PERMISSION])
def test_pynvml_cuda_version_unknown_when_nvml_will_not_say(code):
    """Not supported or no permission makes the CUDA version unknown (""), not an error."""
    reader, fake = _reader()
    fake.fail["nvmlSystemGetCudaDriverVersion_v2"] = code
    fake.fail["nvmlSystemGetCudaDriverVersion"] = code
    assert reader.cuda_driver_version() == ""


@pytest.mark.timeout(10)
def test_pynvml_cuda_version_other_failures_are_our_error():
    """Any other NVML failure of the CUDA version call is an NvmlReadError naming the call."""
    reader, fake = _reader()
    fake.fail["nvmlSystemGetCudaDriverVersion_v2"] = UNKNOWN
    with pytest.raises(NvmlReadError, match="nvmlSystemGetCudaDriverVersion_v2"):
        reader.cuda_driver_version()


@pytest.mark.timeout(10)
def test_cuda_version_numbers_and_text():
    """NVML's version numbers become MAJOR.MINOR text, and only MAJOR.MINOR text parses back."""
    assert [cuda_version_text(v) for v in (12040, 12000, 11080, 10010, 0, -1)] == [
        "12.4",
        "12.0",
        "11.8",
        "10.1",
        "",
        "",
    ]
    assert parse_cuda_version("12.4") == (12, 4) and parse_cuda_version(" 11.8 ") == (11, 8)
    assert [parse_cuda_version(t) for t in ("12", "12.4.1", "v12.4", "", "\uff11\uff12.4")] == [None] * 5


# ---------------------------------------------------------------------- pynvml: power


@pytest.mark.timeout(10)
def test_pynvml_power_limits_in_whole_watts():
    """The limit, its range and its default are read in milliwatts and given in whole watts."""
    gpu = FakeGpu(
        "GPU-a", power_limit_mw=349_600, power_range_mw=(100_500, 400_900), power_default_mw=400_000
    )
    reader, _ = _reader(gpu)
    assert reader.power_limits(0) == PowerLimits(limit_w=350, min_w=101, max_w=400, default_w=400)
    assert reader.power_limits(0).known


@pytest.mark.timeout(10)
@pytest.mark.parametrize("code", [NOT_SUPPORTED, NO_PERMISSION])
def test_pynvml_power_limits_unknown_when_nvml_will_not_say(code):
    """A GPU without power management, or an agent not allowed to ask, has unknown limits."""
    reader, fake = _reader()
    fake.fail["nvmlDeviceGetPowerManagementLimit"] = code
    assert reader.power_limits(0) == PowerLimits() and not reader.power_limits(0).known
    fake.fail.clear()
    fake.fail["nvmlDeviceGetPowerManagementLimitConstraints"] = code
    fake.fail["nvmlDeviceGetPowerManagementDefaultLimit"] = code
    assert reader.power_limits(1) == PowerLimits(limit_w=400)  # the limit alone is still worth telling


@pytest.mark.timeout(10)
def test_pynvml_power_limits_of_a_lost_gpu_are_an_error():
    """A GPU that fell off the bus is an NvmlReadError flagged as lost, like every other read."""
    reader, fake = _reader()
    fake.fail["nvmlDeviceGetPowerManagementLimit"] = GPU_IS_LOST
    with pytest.raises(NvmlReadError) as caught:
        reader.power_limits(1)
    assert caught.value.gpu_lost and caught.value.gpu == 1


@pytest.mark.timeout(10)
def test_pynvml_sets_power_limits_in_milliwatts():
    """set_power_limit passes milliwatts to nvmlDeviceSetPowerManagementLimit; refusals are our error."""
    reader, fake = _reader()
    reader.set_power_limit(1, 250)
    assert fake.power_sets == [(1, 250_000)] and reader.power_limits(1).limit_w == 250
    with pytest.raises(NvmlReadError, match="nvmlDeviceSetPowerManagementLimit on GPU 0"):
        reader.set_power_limit(0, 999)  # outside the range: NVML's invalid argument
    fake.fail["nvmlDeviceSetPowerManagementLimit"] = NO_PERMISSION
    with pytest.raises(NvmlReadError, match="code 4"):
        reader.set_power_limit(0, 200)
    with pytest.raises(NvmlReadError, match="not a limit"):
        reader.set_power_limit(0, 0)
    assert fake.power_sets == [(1, 250_000)]


# ---------------------------------------------------------------------- simulation


@pytest.mark.timeout(10)
def test_simulated_driver_and_cuda_defaults_and_overrides():
    """A simulated machine runs driver 550.54.15 with CUDA 12.4 unless told other versions."""
    sim = SimulatedNvml(catalog_machine("hgx-h100"))
    assert (sim.driver_version(), sim.cuda_driver_version()) == ("550.54.15", "12.4")
    old = SimulatedNvml(catalog_machine("hgx-h100"), driver="470.82.01", cuda_version="11.4")
    assert (old.driver_version(), old.cuda_driver_version()) == ("470.82.01", "11.4")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("name", "limits"),
    [
        ("dgx-a100", PowerLimits(400, 100, 400, 400)),
        ("hgx-h100", PowerLimits(700, 200, 700, 700)),
        ("dgx1-v100", PowerLimits(300, 100, 300, 300)),
        ("rtx3090-2socket", PowerLimits(350, 100, 350, 350)),
        ("h100-pcie-1gpu", PowerLimits(350, 200, 350, 350)),
        ("pcie-nv12-pairs", PowerLimits(300, 100, 300, 300)),  # a model the table does not know
    ],
)
def test_simulated_power_limits_follow_the_gpu_model(name, limits):
    """Each simulated GPU starts at its model's default limit, settable within the model's range."""
    sim = SimulatedNvml(catalog_machine(name))
    assert {sim.power_limits(i) for i in range(sim.device_count())} == {limits}


@pytest.mark.timeout(10)
def test_simulated_power_limits_are_set_within_range_and_recorded():
    """Setting a limit within range changes it and is recorded; out of range or unprivileged is refused."""
    sim = SimulatedNvml(catalog_machine("dgx-a100"))
    sim.set_power_limit(3, 250)
    assert sim.power_limits(3) == PowerLimits(250, 100, 400, 400) and sim.power_limit_calls == [(3, 250)]
    with pytest.raises(NvmlReadError, match="outside 100-400 W"):
        sim.set_power_limit(3, 401)
    sim.power_settable = False
    with pytest.raises(NvmlReadError, match="Insufficient Permissions"):
        sim.set_power_limit(3, 300)
    sim.set_gpu_lost(2)
    with pytest.raises(NvmlReadError) as caught:
        sim.power_limits(2)
    assert caught.value.gpu_lost
    assert sim.power_limit_calls == [(3, 250)]


@pytest.mark.timeout(10)
def test_simulated_power_table_matches_models_most_specific_first():
    """The model table tells an A100 SXM from a PCIe one, an H100 SXM from a PCIe one, an H200 from an H20."""
    assert simulated_power("NVIDIA A100-SXM4-80GB").max_w == 400
    assert simulated_power("NVIDIA A100 80GB PCIe").max_w == 250
    assert simulated_power("NVIDIA H100 80GB HBM3").max_w == 700
    assert simulated_power("NVIDIA H100 PCIe").max_w == 350
    assert simulated_power("NVIDIA H200").max_w == 700 and simulated_power("NVIDIA H20").max_w == 400


# ---------------------------------------------------------------------- reading the facts


@pytest.mark.timeout(10)
def test_read_driver_never_raises():
    """Driver facts are unknown without NVML, when NVML fails, or when the CUDA text is not MAJOR.MINOR."""
    assert read_driver(None).driver_version == "" and read_driver(None).problems == ()
    reader, fake = _reader()
    assert (read_driver(reader).driver_version, read_driver(reader).cuda_driver_version) == (
        "550.54.15",
        "12.4",
    )
    fake.fail["nvmlSystemGetDriverVersion"] = UNKNOWN
    fake.fail["nvmlSystemGetCudaDriverVersion_v2"] = UNKNOWN
    failed = read_driver(reader)
    assert (failed.driver_version, failed.cuda_driver_version) == ("", "")
    assert len(failed.problems) == 2 and "driver version unknown" in failed.problems[0]
    odd = read_driver(SimulatedNvml(catalog_machine("hgx-h100"), cuda_version="twelve"))
    assert odd.cuda_driver_version == "" and "not MAJOR.MINOR" in odd.problems[0]


@pytest.mark.timeout(10)
def test_read_power_leaves_out_gpus_nvml_will_not_tell():
    """GPUs whose limit is not supported are left out; a GPU that fails is left out and said so."""
    reader, _ = _reader(FakeGpu("GPU-a"), FakeGpu("GPU-b", power_limit_mw=None), FakeGpu("GPU-c"))
    reading = read_power(reader, range(3))
    assert [i for i, _ in reading.limits] == [0, 2] and reading.problems == ()
    assert reading.of(2) == PowerLimits(400, 100, 400, 400) and reading.of(1) is None
    sim = SimulatedNvml(catalog_machine("dgx1-v100"))
    sim.set_gpu_lost(5)
    lost = read_power(sim, range(8))
    assert [i for i, _ in lost.limits] == [0, 1, 2, 3, 4, 6, 7] and "GPU 5" in lost.problems[0]
    assert read_power(None, range(8)) == type(lost)()


# ---------------------------------------------------------------------- flags


@pytest.mark.timeout(10)
def test_simulate_driver_flags_reach_the_simulation():
    """--simulate-driver and --simulate-cuda replace the simulated versions; they need --simulate."""
    config = parse_args(
        ["--simulate=dgx-a100", "--simulate-driver=470.82.01", "--simulate-cuda=11.4", "--no-kube"], env={}
    )
    assert (config.simulate_driver, config.simulate_cuda) == ("470.82.01", "11.4")
    sources = open_sources(
        config.simulate,
        config.node_name,
        use_smi=False,
        nvidia_smi="nvidia-smi",
        simulate_driver=config.simulate_driver,
        simulate_cuda=config.simulate_cuda,
    )
    assert sources.reader is not None
    assert (sources.reader.driver_version(), sources.reader.cuda_driver_version()) == ("470.82.01", "11.4")
    defaults = parse_args(["--simulate=dgx-a100", "--no-kube"], env={})
    assert (defaults.simulate_driver, defaults.simulate_cuda, defaults.set_power_limits) == (
        None,
        None,
        False,
    )
    assert defaults.node_labels
    for bad in (["--simulate-cuda=12.4"], ["--simulate=dgx-a100", "--simulate-cuda=12"]):
        with pytest.raises(SystemExit):
            parse_args(bad, env={})
    flags = parse_args(["--set-power-limits", "--no-node-labels", "--no-kube"], env={})
    assert flags.set_power_limits and not flags.node_labels

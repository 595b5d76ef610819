"""MIG on a simulated machine (`--simulate-mig`): the real profiles of each model, the option's
errors, and the whole agent path in process: discovery, the published GpuTopology, the device
plugin's inventory, the extender's placement and binding, and the device plugin's handout."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from contract.allocation import decode_allocation
from contract.keys import ALLOCATION_ANNOTATION
from extender.config import ExtenderConfig
from extender.kube.in_memory import InMemoryCluster
from extender.service import ExtenderService, handlers_for
from extender.state.snapshot import NodeFacts
from node_agent.config import AgentConfig, parse_args, parse_mig_layout
from node_agent.deviceplugin.broker import AllocationBroker
from node_agent.deviceplugin.container_spec import ENV_VISIBLE_DEVICES
from node_agent.deviceplugin.inventory import Inventory
from node_agent.deviceplugin.pod_records import bound_pod
from node_agent.deviceplugin.record_store import InMemoryPodRecords
from node_agent.kube.node_api import pod_from_dict
from node_agent.loop.agent_loop import Agent
from node_agent.metrics import AgentMetrics
from node_agent.sources.discovery import discover
from node_agent.sources.nvml_simulated import SimulatedNvml
from node_agent.sources.opening import open_sources
from node_agent.sources.simulated_mig import MigLayoutError, carve
from tests.node_agent.fakes import FakeNodeApi
from tests.support.machines import catalog_machine, topo_text
from tests.support.pods import pod_manifest
from tests.support.resources import GPU, NAMES, SHARED, mig_resource
from topology.model import MigMode

pytestmark = pytest.mark.timeout(60)

NODE = "sim-dgx-a100"
MIG_1G = mig_resource("1g.5gb")


def simulated_dgx_a100(*extra: str, mig: str = "7=1g.5gb*7") -> AgentConfig:
    """The agent's configuration for a simulated DGX A100 (A100 40GB) with a MIG layout."""
    argv = ["--simulate", "dgx-a100", "--simulate-mig", mig, "--node-name", NODE, "--no-watchdog", *extra]
    return parse_args(argv, env={})


# ---------------------------------------------------------------------- the option


def test_the_option_reads_gpus_and_their_instances() -> None:
    """`--simulate-mig` gives each listed GPU its instances; `*N` repeats a profile."""
    config = simulated_dgx_a100(mig="6=3g.20gb+2g.10gb+1g.5gb*2, 7=1g.5gb*7")
    assert config.simulate_mig == {
        6: ("3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"),
        7: ("1g.5gb",) * 7,
    }
    assert parse_args(["--simulate", "dgx-a100"], env={}).simulate_mig == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulate", "dgx-a100", "--simulate-mig", "8=1g.5gb"], "no GPU 8: the machine has GPUs 0-7"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=1g.10gb"], "cannot host 1g.10gb"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=1g.5gb*8"], "at most 7 x 1g.5gb, not 8"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=4g.20gb+4g.20gb"], "at most 1 x 4g.20gb"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=4g.20gb+3g.20gb+1g.5gb"], "8 compute slices of 7"),
        (["--simulate", "hgx-h100", "--simulate-mig", "0=1g.20gb*4+1g.10gb"], "9 memory slices of 8"),
        (["--simulate", "dgx1-v100", "--simulate-mig", "0=1g.5gb"], "has no MIG profiles"),
        (["--simulate", "dgx-a100", "--simulate-mig", "seven=1g.5gb"], "'seven' is not a GPU index"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7"], "is not GPU=PROFILE"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=1g.5gb*x"], "needs a positive count"),
        (["--simulate", "dgx-a100", "--simulate-mig", "7=1g.5gb,7=7g.40gb"], "GPU 7 is given twice"),
        (["--simulate-mig", "7=1g.5gb"], "need --simulate"),
    ],
)
def test_a_layout_the_machine_cannot_host_is_a_usage_error_naming_why(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown GPU, a profile the model lacks, too many slices or bad syntax stops the agent
    with a message saying which."""
    with pytest.raises(SystemExit):
        parse_args(argv, env={})
    err = capsys.readouterr().err
    assert message in err, err


def test_parse_mig_layout_lowercases_profiles_and_ignores_spaces() -> None:
    """Profiles are matched in lower case and spaces around the separators do not matter."""
    assert parse_mig_layout(" 0 = 7G.40GB , 1=3g.20gb * 2 ") == {0: ("7g.40gb",), 1: ("3g.20gb", "3g.20gb")}


# ---------------------------------------------------------------------- the simulated GPUs


@pytest.mark.parametrize(
    ("name", "profile", "count", "memory_mib"),
    [
        ("dgx-a100", "1g.5gb", 7, 4864),
        ("dgx-a100", "2g.10gb", 3, 9984),
        ("dgx-a100", "3g.20gb", 2, 20096),
        ("dgx-a100", "4g.20gb", 1, 20096),
        ("dgx-a100", "7g.40gb", 1, 40448),
        ("hgx-a100-80gb", "1g.10gb", 7, 9728),
        ("hgx-a100-80gb", "1g.20gb", 4, 19968),
        ("hgx-a100-80gb", "2g.20gb", 3, 19968),
        ("hgx-a100-80gb", "3g.40gb", 2, 40192),
        ("hgx-a100-80gb", "4g.40gb", 1, 40192),
        ("hgx-a100-80gb", "7g.80gb", 1, 80896),
        ("hgx-h100", "1g.10gb", 7, 9984),
        ("hgx-h100", "1g.20gb", 4, 20096),
        ("hgx-h100", "2g.20gb", 3, 20096),
        ("hgx-h100", "3g.40gb", 2, 40448),
        ("hgx-h100", "4g.40gb", 1, 40448),
        ("hgx-h100", "7g.80gb", 1, 81152),
    ],
)
def test_each_model_fits_its_real_profiles_up_to_their_instance_counts(
    name: str, profile: str, count: int, memory_mib: int
) -> None:
    """A GPU holds as many instances of a profile as the real model, with the profile's memory,
    and refuses one more."""
    sim = SimulatedNvml(catalog_machine(name), node_name="n1", mig_layout={3: (profile,) * count})
    info = sim.mig(3)
    assert info.mode is MigMode.ENABLED
    assert [(m.profile, m.memory_mib) for m in info.devices] == [(profile, memory_mib)] * count
    with pytest.raises(MigLayoutError, match=f"at most {count} x {profile}"):
        SimulatedNvml(catalog_machine(name), mig_layout={3: (profile,) * (count + 1)})


def test_mixed_layouts_fit_where_the_real_placements_allow() -> None:
    """3g+2g+2g fits (the 3g goes to the upper half) and 4g+2g+1g fits; 4g+3g+1g needs 8 compute
    slices and 3g+3g+1g 9 memory slices, so neither does."""
    gpu = SimulatedNvml(catalog_machine("dgx-a100")).gpus[0]
    assert [m.profile for m in carve(gpu, ("3g.20gb", "2g.10gb", "2g.10gb"))] == [
        "2g.10gb",
        "2g.10gb",
        "3g.20gb",
    ]
    assert len(carve(gpu, ("4g.20gb", "2g.10gb", "1g.5gb"))) == 3
    with pytest.raises(MigLayoutError, match="compute"):
        carve(gpu, ("4g.20gb", "3g.20gb", "1g.5gb"))
    with pytest.raises(MigLayoutError, match="memory"):
        carve(gpu, ("3g.20gb", "3g.20gb", "1g.5gb"))


def test_mig_uuids_are_real_looking_distinct_and_stable_per_node_and_gpu() -> None:
    """MIG UUIDs have the driver's `MIG-<uuid>` form, differ between instances, GPUs and nodes, and
    are the same every time the same node starts."""
    layout = {6: ("1g.5gb",) * 7, 7: ("1g.5gb",) * 7}
    first = SimulatedNvml(catalog_machine("dgx-a100"), node_name="n1", mig_layout=layout)
    again = SimulatedNvml(catalog_machine("dgx-a100"), node_name="n1", mig_layout=layout)
    other = SimulatedNvml(catalog_machine("dgx-a100"), node_name="n2", mig_layout=layout)
    uuids = [m.uuid for i in (6, 7) for m in first.mig(i).devices]
    assert all(u.startswith("MIG-") and len(u) == 40 for u in uuids)
    assert len(set(uuids)) == 14
    assert uuids == [m.uuid for i in (6, 7) for m in again.mig(i).devices]
    assert not set(uuids) & {m.uuid for i in (6, 7) for m in other.mig(i).devices}
    assert [m.gpu_instance_id for m in first.mig(7).devices] == list(range(7, 14))
    assert {m.compute_instance_id for m in first.mig(7).devices} == {0}
    assert first.mig(0).mode is MigMode.UNSUPPORTED  # the GPUs left out stay whole


# ---------------------------------------------------------------------- the agent path


def _published(config: AgentConfig) -> tuple[Any, FakeNodeApi]:
    """Open the configured sources, run the agent's first poll, and read the GpuTopology back
    through the contract's codec as the extender would."""
    assert config.simulate is not None
    sources = open_sources(
        config.simulate,
        config.node_name,
        use_smi=config.use_smi,
        nvidia_smi=config.nvidia_smi,
        simulate_mig=config.simulate_mig,
    )
    api = FakeNodeApi(config.node_name)
    agent = Agent(config, sources.reader, api, AgentMetrics(), sources.topo_text)
    agent.poll()
    published = api.get_topology(config.node_name)
    assert published is not None
    return published, api


def test_discovery_lists_the_mig_instances_of_the_simulated_gpus() -> None:
    """Discovery of a DGX A100 started with GPU 7 as seven 1g.5gb instances finds GPU 7 in MIG
    mode with those seven instances and every other GPU whole."""
    config = simulated_dgx_a100()
    sim = SimulatedNvml.from_machine("dgx-a100", node_name=NODE, mig_layout=config.simulate_mig)
    gpus = discover(sim, topo_text("dgx-a100")).topology.gpus
    assert gpus[7].mig_mode is MigMode.ENABLED
    assert Counter(m.profile for m in gpus[7].mig_devices) == {"1g.5gb": 7}
    assert all(g.mig_mode is not MigMode.ENABLED and not g.mig_devices for g in gpus[:7])


def test_the_published_gpu_topology_carries_the_mig_instances() -> None:
    """The GpuTopology the agent publishes, decoded by the contract's codec, has GPU 7's seven
    MIG instances with their UUIDs, profile and memory."""
    config = simulated_dgx_a100()
    published, _ = _published(config)
    sim = SimulatedNvml.from_machine("dgx-a100", node_name=NODE, mig_layout=config.simulate_mig)
    gpu = published.topology.gpus[7]
    assert gpu.mig_mode is MigMode.ENABLED
    assert gpu.mig_devices == sim.mig(7).devices
    assert [m.memory_mib for m in gpu.mig_devices] == [4864] * 7


def test_the_device_plugin_offers_mig_instances_and_not_their_gpu() -> None:
    """The device plugin's inventory of the published node advertises nvidia.com/mig-1g.5gb with
    seven devices (the MIG UUIDs) and offers GPU 7 neither whole nor as share units."""
    config = simulated_dgx_a100()
    published, _ = _published(config)
    inventory = Inventory.from_topology(published.topology, config.units_per_gpu, config.resources)
    gpu7 = published.topology.gpus[7]
    assert inventory.resources == (GPU, SHARED, MIG_1G)
    assert [d.id for d in inventory.devices(MIG_1G)] == [m.uuid for m in gpu7.mig_devices]
    whole = [d.id for d in inventory.devices(GPU)]
    assert len(whole) == 7 and gpu7.uuid not in whole
    shares = inventory.devices(SHARED)
    assert len(shares) == 7 * config.units_per_gpu
    assert not [d for d in shares if d.id.startswith(gpu7.uuid)]


def _pod(name: str, limits: dict[str, str]) -> dict[str, Any]:
    return pod_manifest(
        name, uid=f"uid-{name}", resource_version="1", limits=limits, limits_only=True, image="cuda"
    )


def _bind(service: ExtenderService, cluster: InMemoryCluster, manifest: dict[str, Any]) -> dict[str, Any]:
    created = cluster.create_pod(manifest)
    meta = created["metadata"]
    reply = service.bind(
        {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": NODE}
    )
    assert reply == {"Error": ""}, reply
    return dict(cluster.read_pod(meta["namespace"], meta["name"]).manifest)


def test_a_mig_pod_is_placed_on_an_instance_and_the_device_plugin_hands_it_out() -> None:
    """The extender binds a nvidia.com/mig-1g.5gb pod to the published node with a record naming
    one of GPU 7's instances, a 7-GPU pod gets GPUs 0-6, and the device plugin's allocator turns
    the MIG record into a container with NVIDIA_VISIBLE_DEVICES naming that MIG UUID."""
    config = simulated_dgx_a100()
    published, _ = _published(config)
    gpu7 = published.topology.gpus[7]
    extender_config = ExtenderConfig()
    cluster = InMemoryCluster(extender_config)
    cluster.add_node(NodeFacts(NODE), published)
    service = ExtenderService(extender_config, cluster)
    cluster.run_watches(handlers_for(service), lambda: True)

    stored = _bind(service, cluster, _pod("mig", {MIG_1G: "1"}))
    record = decode_allocation(stored["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert record.node == NODE and len(record.grants) == 1
    (grant,) = record.grants
    assert grant.index == 7 and grant.uuid == gpu7.uuid
    assert grant.mig_uuid in {m.uuid for m in gpu7.mig_devices}

    seven = _bind(service, cluster, _pod("seven", {GPU: "7"}))
    whole = decode_allocation(seven["metadata"]["annotations"][ALLOCATION_ANNOTATION])
    assert sorted(g.index for g in whole.grants) == list(range(7))

    inventory = Inventory.from_topology(published.topology, config.units_per_gpu, config.resources)
    store = InMemoryPodRecords([bound_pod(pod_from_dict(stored, NAMES.managed))])
    broker = AllocationBroker(inventory, store)
    spec = broker.allocate(MIG_1G, [inventory.devices(MIG_1G)[0].id])
    assert spec.env(ENV_VISIBLE_DEVICES) == grant.mig_uuid
    assert spec.env("LINKPACK_ENFORCEMENT") == "mig"

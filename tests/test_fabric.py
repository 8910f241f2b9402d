"""The fabric rows of the stamp and the partition shape, driven by the fake NVML (tests/fake_nvml.py)."""

import pynvml
import pytest

import fake_nvml
from fake_nvml import Fabric, GPU, Scenario, health_mask
from ccbridge import env, fabric
from ccbridge.report.tables import machine_table


def nvml(sc: Scenario) -> dict:
    return env.nvml_info(fake_nvml.make(sc))


def test_a_b300_tenant_of_four_is_one_clique_of_four_healthy_gpus():
    info = nvml(fake_nvml.b300_tenant(4, clique=11))
    f = info["gpus"][0]["fabric"]
    assert f["state"] == "completed" and f["status"] == "success" and f["clique_id"] == 11
    assert f["cluster_uuid"] == "00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert fabric.health_problems(f["health"]) == [] and f["health"]["gfm_state"] == "connected"
    assert info["fabric"] == {"cliques": [{"cluster_uuid": f["cluster_uuid"], "clique_id": 11, "gpus": [0, 1, 2, 3]}],
                              "gpus_per_clique": [4], "gpus": 4}
    assert info["gpus"][2]["nvlink"] == {"links": 18, "active": 18}
    assert info["gpus"][2]["peers"] == {"nvlink": [0, 1, 3]}


def test_only_completed_gpus_make_cliques_and_each_clique_is_its_own():
    gpus = [GPU(fabric=Fabric(clique=1)), GPU(fabric=Fabric(clique=2)), GPU(fabric=Fabric(clique=1)),
            GPU(fabric=Fabric(state=pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS)),
            GPU(fabric=Fabric(state=pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED))]
    info = nvml(Scenario(gpus=gpus))
    assert [g["fabric"]["state"] for g in info["gpus"]] == ["completed", "completed", "completed", "in-progress",
                                                           "not-started"]
    assert [c["gpus"] for c in info["fabric"]["cliques"]] == [[0, 2], [1]]
    assert info["fabric"]["gpus_per_clique"] == [2, 1] and info["fabric"]["gpus"] == 5
    text = fabric.summary(info)
    assert "GPU 3 in-progress" in text and "GPU 4 not-started" in text


def test_a_gpu_off_any_fabric_gives_the_drivers_reason_and_no_clique():
    info = nvml(fake_nvml.h100_cc_off())
    assert info["gpus"][0]["fabric"] == {"error": "NVMLError_NotSupported: Not Supported"}
    assert "Not Supported" in info["gpus"][0]["nvlink"]["error"]
    assert info["fabric"] == {"cliques": [], "gpus_per_clique": [], "gpus": 1}
    assert fabric.summary(info).startswith("not on an NVLink fabric (GPU fabric info: NVMLError_NotSupported")


def test_a_failed_registration_names_nvmls_error():
    info = nvml(Scenario(gpus=[GPU(fabric=Fabric(state=pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
                                                 status=pynvml.NVML_ERROR_NOT_READY))]))
    assert info["gpus"][0]["fabric"]["status"] == "NVML_ERROR_NOT_READY"


@pytest.mark.parametrize("bits, problems", [
    (dict(degraded_bw=1), ["degraded_bw=True"]),
    (dict(route_recovery=1, route_unhealthy=1), ["route_recovery=True", "route_unhealthy=True"]),
    (dict(access_timeout_recovery=1), ["access_timeout_recovery=True"]),
    (dict(incorrect_configuration=4), ["incorrect_configuration=no-partition"]),
    (dict(incorrect_configuration=5), ["incorrect_configuration=insufficient-nvlinks"]),
    (dict(partition_assigned=2), ["partition_assigned=False"]),
    (dict(gfm_state=2), ["gfm_state=disconnected"]),
    (dict(), []),  # every field not supported: nothing to say, nothing wrong
])
def test_each_health_bit_is_decoded(bits, problems):
    f = nvml(Scenario(gpus=[GPU(fabric=Fabric(health=health_mask(**bits)))]))["gpus"][0]["fabric"]
    assert f["health_mask"] == health_mask(**bits)
    assert fabric.health_problems(f["health"]) == problems
    assert all(v == "not-supported" for k, v in f["health"].items() if k not in bits)


def test_an_older_driver_is_asked_with_the_older_struct():
    f = nvml(Scenario(gpus=[GPU(fabric=Fabric(health=health_mask(degraded_bw=2)),
                                fabric_versions=("nvmlGpuFabricInfo_v2",))]))["gpus"][0]["fabric"]
    assert f["state"] == "completed" and f["health"]["degraded_bw"] is False and "health_summary" not in f
    none = nvml(Scenario(gpus=[GPU(fabric=Fabric(), fabric_versions=())]))["gpus"][0]["fabric"]
    assert none["error"].startswith("NVMLError_ArgumentVersionMismatch")


def test_the_health_summary_of_the_v3_struct():
    sc = Scenario(gpus=[GPU(fabric=Fabric(summary=pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY))])
    assert nvml(sc)["gpus"][0]["fabric"]["health_summary"] == "limited-capacity"


def test_nvlink_counts_links_up_to_the_gpus_last_and_peers_need_p2p_over_nvlink():
    sc = Scenario(gpus=[GPU(nvlinks=[1, 0, 1], nvlink_peers={1}), GPU(nvlinks=[1], nvlink_peers=set())])
    info = nvml(sc)
    assert info["gpus"][0]["nvlink"] == {"links": 3, "active": 2}
    assert info["gpus"][0]["peers"]["nvlink"] == [1] and info["gpus"][1]["peers"]["nvlink"] == []


def test_the_machine_table_shows_mode_and_partition_within_120_columns():
    sc = fake_nvml.b300_tenant(8)
    sc.gpus[5].fabric = Fabric(health=health_mask(gfm_state=2))
    rows = dict(machine_table({"nvml": nvml(sc)}).rows)
    assert "multi-GPU mode nvle" in rows["GPU CC mode (NVML)"]
    fab = rows["NVLink fabric (NVML)"]
    assert "GPUs per clique [8] of 8" in fab and "GPU 5 gfm_state=disconnected" in fab
    assert len(fab) <= 120

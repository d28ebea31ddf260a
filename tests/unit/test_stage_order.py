"""The GPU node's stages run in the plan's order (gpufleet.plan.STAGE_ORDER).

pyinfra orders a deploy's operations by the source lines they are called from (``get_operation_order_from_stack``),
not by the order of the calls: the deploy calls each stage's operations from its own function, and those functions
must stand in the module in the plan's order, or pyinfra would run them in another one whatever the plan says."""

from __future__ import annotations

import inspect

from gpufleet.config import STAGES, load_node_config
from gpufleet.deploys import gpu_node
from gpufleet.plan import GPU_STAGES, STAGE_ORDER, NodePlan, stage_order


def test_the_deploys_stage_functions_stand_in_the_plans_order():
    operations = gpu_node._GPU_STAGE_OPERATIONS
    assert set(operations) == set(GPU_STAGES)
    lines = {stage: inspect.getsourcelines(function)[1] for stage, function in operations.items()}
    assert sorted(lines, key=lines.get) == [stage for stage in STAGE_ORDER if stage in GPU_STAGES]
    # the driver stage before, the exporters after every GPU stage (called from gpu_node() in that order)
    source = inspect.getsource(gpu_node.gpu_node)
    assert source.index("driver_stage(") < source.index("gpu_stages(") < source.index("exporters_stage(")


def test_the_plan_lists_the_enabled_stages_in_its_order():
    config = load_node_config("n", {"gpufleet_stages": ["driver", "power", "mig", "exporters", "slurm"]})
    assert stage_order(config) == ("driver", "mig", "power", "slurm", "exporters")
    assert NodePlan.resolve(config, []).stages == ("driver", "mig", "power", "slurm", "exporters")
    assert set(STAGE_ORDER) == set(STAGES)  # every stage a user may list has its place


def test_any_order_of_gpufleet_stages_runs_in_the_plans_order():
    listed = list(reversed(STAGE_ORDER))  # refused as "out of order" while config kept an order of its own
    config = load_node_config("n", {"gpufleet_stages": listed})
    assert config.stages == tuple(listed)
    assert stage_order(config) == STAGE_ORDER

"""The phase machine, transition by transition, over the trainer's typed /status."""

import pytest

from streamrl.operator.crd import rljob_crd
from streamrl.operator.phases import JobPhase, Observed, TrainerGroup, derive, resumed_event
from streamrl.records import CheckpointInfo, TrainerPhase
from tests.unit.operator.trainer_bodies import last_iteration, trainer_status

NOW, LATER = "2026-12-02T10:00:00Z", "2026-12-02T10:05:00Z"
POOLS = [{"name": "l4", "cluster": "", "replicas": 2, "readyReplicas": 2}]
RUNNING = trainer_status(TrainerPhase.RUNNING, iteration=3, num_iterations=10, samples_per_s=100.0,
                         last=last_iteration(3, reward_mean=0.5, pipeline_bubble_ratio=0.1))


def conditions(status):
    return {c["type"]: c["status"] for c in status["conditions"]}


@pytest.mark.parametrize("phase, terminal", [
    (JobPhase.PENDING, False), (JobPhase.RUNNING, False), (JobPhase.SUSPENDED, False),
    (JobPhase.SUCCEEDED, True), (JobPhase.FAILED, True), (JobPhase.INVALID, True),
])
def test_job_phase_is_terminal(phase, terminal):
    assert phase.is_terminal is terminal


def test_job_phases_are_the_crds_enum_and_read_back_from_status():
    status = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"]["phase"]["enum"] == ["Pending", "Running", "Suspended", "Succeeded", "Failed",
                                                     "Invalid"]
    assert JobPhase.of("Succeeded") is JobPhase.SUCCEEDED
    assert JobPhase.of(None) is None and JobPhase.of("Done") is None


OK = {"ClustersReady", "PodsReady"}


@pytest.mark.parametrize("obs, phase, true_conditions", [
    (Observed(1, invalid="spec.algorithm.groupSize: too small"), "Invalid", {"Failed"} | OK),
    (Observed(1, pools=POOLS), "Pending", OK),
    (Observed(1, pools=POOLS, trainer=RUNNING), "Running", {"Ready", "Progressing"} | OK),
    (Observed(1, pools=POOLS, trainer=RUNNING, suspended=True), "Suspended", {"Suspended", "Ready"} | OK),
    (Observed(1, trainer_job={"conditions": [{"type": "Complete", "status": "True"}]}), "Succeeded", {"Complete"} | OK),
    (Observed(1, trainer_job={"conditions": [{"type": "SuccessCriteriaMet", "status": "True"}]}), "Succeeded",
     {"Complete"} | OK),
    (Observed(1, trainer_job={"completedIndexes": "0,2"}), "Succeeded", {"Complete"} | OK),
    (Observed(1, trainer_job={"conditions": [{"type": "Failed", "status": "True"}]}), "Failed", {"Failed"} | OK),
    (Observed(1, pools=POOLS, cluster_problem="RLCluster 'west' is not registered"), "Pending", {"PodsReady"}),
])
def test_phases(obs, phase, true_conditions):
    status = derive(obs, None, NOW)
    assert status["phase"] == phase
    assert {k for k, v in conditions(status).items() if v == "True"} == true_conditions
    assert status["observedGeneration"] == 1


def test_progress_and_transition_times():
    first = derive(Observed(4, pools=POOLS, trainer=RUNNING), None, NOW)
    assert first["trainer"] == {"ready": True, "readyPods": 0, "expectedPods": 0, "restarts": 0, "preemptions": 0,
                                "iteration": 3, "policyVersion": 3, "reward": 0.5, "pipelineBubbleRatio": 0.1,
                                "samplesPerSecond": 100.0, "incarnation": 0, "resumedFrom": None,
                                "lastCheckpoint": None}
    assert first["generators"]["readyReplicas"] == 2 and first["message"] == "iteration 3 of 10"
    # An unchanged condition keeps its transition time; a changed one gets the new time.
    again = derive(Observed(4, pools=POOLS, trainer=RUNNING), first["conditions"], LATER)
    assert {c["type"]: c["lastTransitionTime"] for c in again["conditions"]}["Ready"] == NOW
    done = derive(Observed(4, pools=POOLS, trainer_job={"completedIndexes": "0"}), again["conditions"], LATER)
    times = {c["type"]: c["lastTransitionTime"] for c in done["conditions"]}
    assert times["Complete"] == LATER and times["ClustersReady"] == NOW


@pytest.mark.parametrize("phase, iteration, message", [
    (TrainerPhase.LOADING, 0, "trainer loading the model"),
    (TrainerPhase.RESUMING, 12, "trainer resuming from iteration 12"),
])
def test_a_starting_trainer_says_what_it_does_in_the_pending_message(phase, iteration, message):
    """N6: its /status answers while the model or a checkpoint loads; the job says which."""
    status = derive(Observed(1, pools=POOLS, trainer=trainer_status(phase, iteration=iteration)), None, NOW)
    assert (status["phase"], status["message"]) == ("Pending", message)
    assert status["trainer"]["ready"] is False


def test_a_trainer_before_its_first_iteration_reports_no_reward_and_its_phase():
    waiting = trainer_status(TrainerPhase.WAITING_FOR_GENERATORS, iteration=0)
    status = derive(Observed(1, pools=POOLS, trainer=waiting), None, NOW)
    assert (status["phase"], status["message"]) == ("Pending", "WaitingForGenerators")
    assert status["trainer"] == {"ready": False, "readyPods": 0, "expectedPods": 0, "restarts": 0, "preemptions": 0,
                                 "iteration": 0, "policyVersion": 0, "samplesPerSecond": 100.0, "incarnation": 0,
                                 "resumedFrom": None, "lastCheckpoint": None}


def test_an_unreadable_trainer_status_is_said_in_the_message_and_the_ready_condition():
    why = "policy_version: Field required"
    status = derive(Observed(2, pools=POOLS, trainer_unreadable=why), None, NOW)
    assert status["phase"] == "Pending"
    assert status["message"] == f"the trainer's /status is unreadable: {why}"
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "TrainerStatusUnreadable")
    assert why in ready["message"] and "2/2 generators ready" in ready["message"]
    assert status["trainer"] == {"ready": False, "readyPods": 0, "expectedPods": 0, "restarts": 0,
                                 "preemptions": 0}  # none half-read


FAILED_JOB = {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}


@pytest.mark.parametrize("group, phase, message", [
    (TrainerGroup("restarting", 1, "restarting the trainer group (restart 1 of 2): pod big-trainer-2 exited 1"),
     "Pending", "restarting the trainer group (restart 1 of 2): pod big-trainer-2 exited 1"),
    (TrainerGroup("waiting", 1, "waiting for the previous trainer Job and its pods to be deleted"), "Pending",
     "waiting for the previous trainer Job and its pods to be deleted"),
    (TrainerGroup("failed", 2, "the trainer group failed after 2 restart(s) (budget 2): exit 1"), "Failed",
     "the trainer group failed after 2 restart(s) (budget 2): exit 1; generators and ranker scaled to 0 (to train "
     "again, create the RLJob anew)"),
    (None, "Failed", "the trainer failed; see its pods' logs; generators and ranker scaled to 0 (to train again, "
                     "create the RLJob anew)"),
    (TrainerGroup("restarting", 1, "restarting the trainer group, preempted: ... (not counted against the restart "
                                   "budget): exit code 75", preemptions=1), "Pending",
     "restarting the trainer group, preempted: ... (not counted against the restart budget): exit code 75"),
])
def test_a_failed_trainer_group_is_pending_while_it_restarts_and_failed_when_no_restart_is_left(group, phase, message):
    status = derive(Observed(2, pools=POOLS, trainer_job=FAILED_JOB, trainer_group=group, trainer_pods=(0, 3)),
                    None, NOW)
    assert (status["phase"], status["message"]) == (phase, message)
    assert status["trainer"]["restarts"] == (group.restarts if group else 0)
    assert conditions(status)["Failed"] == ("True" if phase == "Failed" else "False")


def test_the_ready_condition_counts_trainer_pods():
    status = derive(Observed(1, pools=POOLS, trainer=RUNNING, trainer_pods=(2, 3),
                             trainer_group=TrainerGroup("unchanged", 1)), None, NOW)
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert ready["message"] == "trainer running, 2/3 trainer pods ready, 2/2 generators ready"
    assert (status["trainer"]["readyPods"], status["trainer"]["expectedPods"], status["trainer"]["restarts"]) == \
        (2, 3, 1)


def test_a_suspended_job_whose_group_stopped_on_sigterm_reads_suspended_not_failed_nor_succeeded():
    """suspend: the Job controller deletes the pods, the trainer saves and exits 75, the pod
    failure policy fails the Job, and the operator creates it again (suspended) for free."""
    restarting = TrainerGroup("restarting", 0, "restarting the trainer group, stopped while suspended (...)",
                              FAILED_JOB, preemptions=1)
    for group in (restarting, TrainerGroup("created", 0, preemptions=1)):
        status = derive(Observed(3, pools=POOLS, suspended=True, trainer_job=group.job_status, trainer_group=group),
                        None, NOW)
        assert status["phase"] == "Suspended", group.action
        assert conditions(status)["Failed"] == "False" and conditions(status)["Complete"] == "False"
        assert (status["trainer"]["restarts"], status["trainer"]["preemptions"]) == (0, 1)
    # A group that failed with no restart left stays Failed, suspended or not.
    failed = TrainerGroup("failed", 2, "the trainer group failed after 2 restart(s) (budget 2): exit 1", FAILED_JOB)
    assert derive(Observed(3, suspended=True, trainer_job=FAILED_JOB, trainer_group=failed), None, NOW)["phase"] == \
        "Failed"


def test_a_resumed_trainer_shows_its_start_resume_point_and_last_checkpoint():
    resumed = RUNNING.model_copy(update={"incarnation": 2, "resumed_from": 7, "last_checkpoint": CheckpointInfo(
        iteration=10, time_unix=1_800_000_000.0, path="/var/lib/streamrl/out/checkpoints/iter-00010")})
    trainer = derive(Observed(1, pools=POOLS, trainer=resumed), None, NOW)["trainer"]
    assert (trainer["incarnation"], trainer["resumedFrom"]) == (2, 7)
    assert trainer["lastCheckpoint"] == {"iteration": 10, "time": "2027-01-15T08:00:00Z"}


@pytest.mark.parametrize("incarnation, resumed_from, seen, posted", [
    (0, None, -1, False),  # a fresh start: nothing resumed
    (1, 7, 0, True),       # the first restart, resumed at 7
    (1, 7, 1, False),      # already announced (memo or status)
    (3, 40, -1, True),     # a new RLJob on a retained claim: announced once
])
def test_a_resumed_event_is_posted_once_per_start_that_resumed(incarnation, resumed_from, seen, posted):
    trainer = RUNNING.model_copy(update={"incarnation": incarnation, "resumed_from": resumed_from})
    message = resumed_event(trainer, seen)
    assert (message is not None) is posted
    if posted:
        assert message == (f"the trainer resumed at iteration {resumed_from} from its checkpoint "
                           f"(start {incarnation + 1} of run tiny-0)")
    assert resumed_event(None, -1) is None

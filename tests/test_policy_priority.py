"""A job's priority orders it within its own project only: it never takes another project's
turn (issue 12, a hostile user giving every job the highest priority)."""

from builders import cluster, pending, project, running, started, step


def test_a_high_priority_job_does_not_go_before_an_older_job_of_another_project():
    # 2 GPUs free; vision and nlp both wait within their quotas. nlp asked first; vision's
    # job says priority 100. nlp's job starts on the free GPUs, vision's reclaims the rest.
    snap = (cluster(nodes=1, gpus_per_node=4)
            .projects(project("vision").quota(2), project("nlp").quota(2), project("other"))
            .jobs(running("o1", "other", 2, 0),
                  pending("v1", "vision", gpus=2, submitted=10, priority=100),
                  pending("n1", "nlp", gpus=2, submitted=5, priority=0))
            .at(20))
    result, _ = step(snap)
    assert started(result) == {"n1": {"n0": 2}}


def test_within_a_project_the_higher_priority_goes_first():
    snap = (cluster(nodes=1, gpus_per_node=2)
            .projects(project("vision").quota(2))
            .jobs(pending("v1", "vision", gpus=2, submitted=5),
                  pending("v2", "vision", gpus=2, submitted=10, priority=5))
            .at(20))
    result, _ = step(snap)
    assert started(result) == {"v2": {"n0": 2}}

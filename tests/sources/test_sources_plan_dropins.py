"""The budget vllm-xpu-plan's drop-in gives each unit, read from the drop-in (sources/plan_dropins.py): the parse
of its line, and which files are believed (only those root alone can have written). On a real systemd with
the packaged exporter: test_planner_applied_real_systemd.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mountns import tmpfs_in_own_mount_namespace

from vllm_xpu_exporter.sources.plan_dropins import DROP_IN_NAME, PLAN_FIELD, UnitPlans, parse_drop_in

CHAT, STT = "vllm-xpu-chat.service", "vllm-xpu-stt.service"
NOBODY = 65534
DROP_IN = f"# {CHAT}: written by vllm-xpu-plan\n[Service]\nExecStart=\nExecStart=/usr/bin/vllm serve m " \
          f"--kv-cache-memory-bytes 3481927680\nLogExtraFields={PLAN_FIELD}=3481927680\n"


@pytest.mark.fast
def test_the_budget_is_the_drop_ins_field() -> None:
    assert parse_drop_in(DROP_IN) == 3481927680
    assert parse_drop_in(f"LogExtraFields={PLAN_FIELD}=100\nLogExtraFields={PLAN_FIELD}=200\n") == 200  # the last


@pytest.mark.fast
@pytest.mark.parametrize("value", ["", "-5", "0", "1e9", "12 34", "١٢٣", "9" * 21, "3481927680x"])
def test_a_budget_that_is_not_a_positive_byte_count_is_no_plan(value: str) -> None:
    assert parse_drop_in(f"[Service]\nLogExtraFields={PLAN_FIELD}={value}\n") is None


@pytest.mark.fast
def test_a_field_whose_name_only_begins_with_the_plans_or_a_command_alone_is_no_plan() -> None:
    assert parse_drop_in(f"LogExtraFields={PLAN_FIELD}_OLD=5\nExecStart=vllm --kv-cache-memory-bytes 5\n") is None


@pytest.fixture
def plans(tmp_path: Path) -> Path:
    """A drop-in directory as root keeps it (every directory above it root's and not writable by others)."""
    os.chmod(tmp_path, 0o755)
    directory = tmp_path / "system"
    (directory / f"{CHAT}.d").mkdir(parents=True)
    (directory / f"{CHAT}.d" / DROP_IN_NAME).write_text(DROP_IN)
    for path in (directory, directory / f"{CHAT}.d", directory / f"{CHAT}.d" / DROP_IN_NAME):
        os.chmod(path, 0o644 if path.is_file() else 0o755)
    return directory


def require_root_owned_tree(path: Path) -> None:
    for parent in [path, *path.parents]:
        info = parent.stat()
        if info.st_uid != 0 or (info.st_mode & 0o022 and not info.st_mode & 0o1000):
            pytest.fail(f"{parent} is not root's alone: run as root from a directory root owns")


def test_a_root_owned_drop_in_gives_its_unit_a_plan_and_a_unit_without_one_has_none(plans: Path) -> None:
    require_root_owned_tree(plans)
    assert UnitPlans(str(plans)).plans([CHAT, STT, "docker/vllm", "../x.service"]) == ({CHAT: 3481927680}, [])
    assert UnitPlans(str(plans / "absent")).plans([CHAT]) == ({}, [])


def test_the_directory_given_may_be_a_symlink_of_roots(plans: Path) -> None:
    require_root_owned_tree(plans)
    (plans.parent / "link").symlink_to(plans)
    assert UnitPlans(str(plans.parent / "link")).plans([CHAT]) == ({CHAT: 3481927680}, [])


@pytest.mark.parametrize("change", ["file owned by nobody", "directory owned by nobody", "file group-writable",
                                    "directory world-writable", "file a symlink", "directory a symlink"])
def test_a_drop_in_someone_else_may_have_written_is_not_believed_and_says_why_the_others_are_read(
        plans: Path, change: str) -> None:
    require_root_owned_tree(plans)
    unit_dir = plans / f"{CHAT}.d"
    file = unit_dir / DROP_IN_NAME
    if change == "file owned by nobody":
        os.chown(file, NOBODY, NOBODY)
    elif change == "directory owned by nobody":
        os.chown(unit_dir, NOBODY, NOBODY)
    elif change == "file group-writable":
        os.chmod(file, 0o664)
    elif change == "directory world-writable":
        os.chmod(plans, 0o777)
    elif change == "file a symlink":
        file.rename(plans / "elsewhere.conf")
        file.symlink_to(plans / "elsewhere.conf")
    else:
        unit_dir.rename(plans / "elsewhere.d")
        unit_dir.symlink_to(plans / "elsewhere.d")
    why = "symlink" if "symlink" in change else "owned by uid" if "nobody" in change else "writable by others"
    (plans / f"{STT}.d").mkdir(mode=0o755)
    (plans / f"{STT}.d" / DROP_IN_NAME).write_text(f"LogExtraFields={PLAN_FIELD}=471859200\n")
    found, problems = UnitPlans(str(plans)).plans([CHAT, STT])
    if change == "directory world-writable":  # every unit's path goes through it
        assert found == {} and len(problems) == 2
    else:
        assert found == {STT: 471859200} and len(problems) == 1
    assert all(why in problem and "not believed" in problem for problem in problems), problems


def test_a_fifo_in_place_of_the_drop_in_is_refused_without_waiting(plans: Path) -> None:
    require_root_owned_tree(plans)
    file = plans / f"{CHAT}.d" / DROP_IN_NAME
    file.unlink()
    os.mkfifo(file, 0o644)
    assert UnitPlans(str(plans)).plans([CHAT]) == ({}, [f"{file} is not a regular file: its plan is not believed"])


def test_a_sticky_directory_others_may_write_to_does_not_stop_the_walk(plans: Path) -> None:
    """/tmp-like: others may add entries but not replace root's."""
    require_root_owned_tree(plans)
    os.chmod(plans, 0o1777)
    assert UnitPlans(str(plans)).plans([CHAT]) == ({CHAT: 3481927680}, [])


def test_a_units_drop_in_is_read_again_only_after_the_reread_time(plans: Path) -> None:
    """A scrape does not walk each unit's path from / again: a drop-in changed or removed shows once
    `reread_seconds` have passed since it was read, and a unit asked for again after a pause is read again."""
    require_root_owned_tree(plans)
    now = [1000.0]
    unit_plans = UnitPlans(str(plans), reread_seconds=30, clock=lambda: now[0])
    assert unit_plans.plans([CHAT]) == ({CHAT: 3481927680}, [])
    (plans / f"{CHAT}.d" / DROP_IN_NAME).unlink()
    now[0] += 29
    assert unit_plans.plans([CHAT]) == ({CHAT: 3481927680}, [])
    now[0] += 1
    assert unit_plans.plans([CHAT]) == ({}, [])
    (plans / f"{CHAT}.d" / DROP_IN_NAME).write_text(DROP_IN)
    os.chmod(plans / f"{CHAT}.d" / DROP_IN_NAME, 0o666)
    now[0] += 30
    found, problems = unit_plans.plans([CHAT])
    assert found == {} and len(problems) == 1 and "writable by others than root" in problems[0]


def test_a_plans_directory_given_through_a_link_others_can_swap_is_not_believed(plans: Path) -> None:
    """/tmp-like: a link another user made in a directory everyone may write to. Followed, its owner would
    choose which root-owned directory is read as the plans."""
    require_root_owned_tree(plans)
    shared = plans.parent / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o1777)
    (shared / "plans").symlink_to(plans)
    os.lchown(shared / "plans", NOBODY, NOBODY)
    found, problems = UnitPlans(str(shared / "plans")).plans([CHAT])
    assert found == {} and len(problems) == 1
    assert f"{shared / 'plans'} is a symlink owned by uid {NOBODY}, not root" in problems[0]
    assert "plans directory" in problems[0] and "not believed" in problems[0]
    # root's own link in the same directory: nobody else can remove or swap it
    os.lchown(shared / "plans", 0, 0)
    assert UnitPlans(str(shared / "plans")).plans([CHAT]) == ({CHAT: 3481927680}, [])


def test_a_link_to_the_plans_directory_is_resolved_once(plans: Path) -> None:
    """A link on the way pointed elsewhere later (another root-owned tree with other drop-ins) is not followed."""
    require_root_owned_tree(plans)
    other = plans.parent / "other"
    (other / f"{CHAT}.d").mkdir(parents=True, mode=0o755)
    os.chmod(other, 0o755)
    (other / f"{CHAT}.d" / DROP_IN_NAME).write_text(f"LogExtraFields={PLAN_FIELD}=1\n")
    os.chmod(other / f"{CHAT}.d" / DROP_IN_NAME, 0o644)
    link = plans.parent / "link"
    link.symlink_to(plans)
    now = [0.0]
    unit_plans = UnitPlans(str(link), reread_seconds=30, clock=lambda: now[0])
    assert unit_plans.plans([CHAT]) == ({CHAT: 3481927680}, [])
    link.unlink()
    link.symlink_to(other)
    now[0] += 60
    assert unit_plans.plans([CHAT]) == ({CHAT: 3481927680}, [])


def test_plans_through_proc_pid_root_are_read_in_that_processs_mount_namespace(plans: Path) -> None:
    """`/proc/PID/root/DIR`: the kernel's link lands in PID's mount namespace, where a tmpfs covers DIR with
    other drop-ins; its text (`/`) is the host's root, whose DIR holds the host's."""
    require_root_owned_tree(plans)
    with tmpfs_in_own_mount_namespace(plans) as pid:
        inside = Path(f"/proc/{pid}/root") / str(plans).lstrip("/")
        (inside / f"{CHAT}.d").mkdir(mode=0o755)
        (inside / f"{CHAT}.d" / DROP_IN_NAME).write_text(f"LogExtraFields={PLAN_FIELD}=471859200\n")
        os.chmod(inside / f"{CHAT}.d" / DROP_IN_NAME, 0o644)
        assert UnitPlans(str(inside)).plans([CHAT]) == ({CHAT: 471859200}, [])
    assert UnitPlans(str(plans)).plans([CHAT]) == ({CHAT: 3481927680}, [])


def test_a_link_of_roots_is_not_followed_on_through_another_users_link_in_its_target(plans: Path) -> None:
    """Root's link is trusted, but its target goes through a /tmp-like directory where another user's link
    stands: the walk checks the target's parts as it checks the path given."""
    require_root_owned_tree(plans)
    shared = plans.parent / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o1777)
    (shared / "theirs").symlink_to(plans.parent)
    os.lchown(shared / "theirs", NOBODY, NOBODY)
    (plans.parent / "link").symlink_to(shared / "theirs" / plans.name)
    found, problems = UnitPlans(str(plans.parent / "link")).plans([CHAT])
    assert found == {} and len(problems) == 1
    assert f"{shared / 'theirs'} is a symlink owned by uid {NOBODY}, not root" in problems[0], problems

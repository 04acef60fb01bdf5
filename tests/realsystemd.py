"""A real systemd (Debian 12's systemd 252) booted as PID 1 of private namespaces, for tests of what
systemd itself writes to the journal around starts, restarts, `Type=` and `ExecStartPre=`.

    with RealSystemd(shared_dir) as machine:              # boots in about a second
        machine.write_unit("vllm-a.service", "[Service]\\nExecStart=/bin/sleep 60\\n")
        machine.daemon_reload()
        machine.start("vllm-a.service")
        entries = machine.journal("vllm-a.service")       # journalctl -o json, parsed

How it boots (as root, without touching the host): the launcher joins a fresh child cgroup of its
own cgroup in every hierarchy the host mounts, then `unshare --pid --fork --mount --uts --cgroup
--ipc` runs BOOT_SCRIPT as PID 1 of the new namespaces. The script makes every mount private, mounts
an overlay of `/` whose upper layer is a tmpfs, binds in `/dev`, `/sys` (read-only) and the shared
directory (read-write, at SHARED_INSIDE), mounts fresh tmpfs on `/run` and `/tmp` and a private
cgroup tree on `/sys/fs/cgroup` (rooted at the namespace's cgroups), `pivot_root`s into the overlay,
mounts `/proc` (with `/proc/sys` read-only), checks that `/` is the overlay and execs systemd with
`container=` set and the masks of MASKED_UNITS. The units the machine image enables (its links in
`/etc/systemd/system/*.wants`: postgresql, prometheus, docker, podman's timers ...) are removed from the
overlay, not masked: none starts at boot, and a test may still write and start a unit of the same name
(a `docker.service` of its own) on a host where the package that enables it is installed.

Why the private cgroup tree and the read-only `/sys` and `/proc/sys`: with the host's
`/sys/fs/cgroup` bound in, systemd creates its cgroups at the roots of the host's hierarchies (the
host mounts are not rooted at the cgroup namespace), escapes the memory cgroup it was started in,
makes mount-point directories in the host's cgroup tmpfs and remounts that tmpfs read-only for the
whole machine; with `/proc/sys` writable, systemd-sysctl would set the host kernel's sysctls.

Commands run inside with `nsenter -t <pid1> -a` (`run`, `systemctl`, `journal`); files are written
through `/proc/<pid1>/root`. `shutdown` SIGKILLs PID 1 (the kernel ends the whole namespace) and
removes the cgroups. Inside the namespace the shared directory is SHARED_INSIDE: `inside()` maps a
host path under it to the path the units see.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SYSTEMD = "/lib/systemd/systemd"
SHARED_INSIDE = Path("/realsystemd")
CGROUP_ROOT = Path("/sys/fs/cgroup")
BOOT_TIMEOUT = 30.0

# Units that must not run inside: they would act on the host (udev on its devices, sysctl and module
# loading on its kernel, static /dev nodes in its /dev, gettys on its consoles) or cannot work there.
MASKED_UNITS = (
    "systemd-udev-trigger.service", "systemd-udevd.service", "systemd-udevd-control.socket",
    "systemd-udevd-kernel.socket", "systemd-udev-settle.service",
    "systemd-sysctl.service", "systemd-modules-load.service", "kmod-static-nodes.service",
    "systemd-tmpfiles-setup-dev.service", "systemd-remount-fs.service", "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount", "systemd-hwdb-update.service", "systemd-random-seed.service",
    "console-getty.service", "getty.target", "systemd-pstore.service", "systemd-timesyncd.service",
)

# Journald keeps its files in /run (the namespace's own tmpfs): nothing persists across boots.
JOURNALD_CONF = "[Journal]\nStorage=volatile\n"

BOOT_SCRIPT = r"""#!/bin/bash
# PID 1 of fresh pid/mount/uts/cgroup/ipc namespaces until it execs systemd. Arguments: the host
# directory to mount the root's tmpfs on, the staging tree copied into the new root, the shared
# directory, then systemd's arguments.
set -euo pipefail
rootfs=$1 staging=$2 shared=$3 shared_inside=$4
shift 4
mount --make-rprivate /
mount -t tmpfs -o mode=0755 realsystemd "$rootfs"
mkdir "$rootfs/upper" "$rootfs/work" "$rootfs/root"
new=$rootfs/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$rootfs/upper,workdir=$rootfs/work" "$new"
mount --rbind /dev "$new/dev"
mount --rbind /sys "$new/sys"
mount -o remount,bind,ro "$new/sys"
# A cgroup tree of our own, rooted at this cgroup namespace (mounts made inside it are).
mount -t tmpfs -o mode=0755 cgroup "$new/sys/fs/cgroup"
while read -r mountpoint options; do
    mkdir -p "$new/sys/fs/cgroup/$mountpoint"
    if [ "$options" = cgroup2 ]; then
        mount -t cgroup2 cgroup2 "$new/sys/fs/cgroup/$mountpoint"
    else
        mount -t cgroup -o "$options" cgroup "$new/sys/fs/cgroup/$mountpoint"
    fi
done < "$staging.cgroups"
mount -t tmpfs -o mode=0755 run "$new/run"
mount -t tmpfs -o mode=1777 tmp "$new/tmp"
# The host paths the units run from (the checkout, its virtual environment) when the fresh /run or /tmp
# above would hide them: a checkout under /tmp is common (CI clones anywhere).
while read -r path; do
    mkdir -p "$new$path"
    mount --bind "$path" "$new$path"
done < "$staging.visible"
mkdir -p "$new$shared_inside"
mount --bind "$shared" "$new$shared_inside"
cp -a "$staging/." "$new/"
# The image's own enablement links (whiteouts in the overlay: the host keeps them).
while read -r link; do
    rm -f "$new$link"
done < "$staging.disabled"
mkdir "$new/.oldroot"
cd "$new"
pivot_root . .oldroot
cd /
mount -t proc proc /proc
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
if [ -e /proc/sysrq-trigger ]; then
    mount --bind /proc/sysrq-trigger /proc/sysrq-trigger
    mount -o remount,bind,ro /proc/sysrq-trigger
fi
umount -l /.oldroot
rmdir /.oldroot
# Booted on the host's real root, systemd-tmpfiles would empty the host's /tmp.
root_type=$(stat -f -c %T /)
if [ "$root_type" != overlayfs ]; then
    echo "realsystemd: / is $root_type, not the overlay: not starting systemd" >&2
    exit 1
fi
exec env -i container=realsystemd-test /lib/systemd/systemd --system "$@"
"""


def hidden_host_paths() -> list[str]:
    """The checkout and the interpreter's environments, where the namespace's fresh /run and /tmp would
    hide them from the units (which run the checkout's code with this interpreter)."""
    checkout = Path(__file__).resolve().parents[1]
    candidates = {str(checkout), sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent)}
    hidden = [path for path in candidates if path.startswith(("/tmp/", "/run/"))]
    # A path inside another one is bound with it.
    return sorted(path for path in hidden if not any(path.startswith(other + "/") for other in hidden))


class BootError(RuntimeError):
    """The namespace or systemd did not come up."""


@dataclass(frozen=True)
class Hierarchy:
    """A cgroup hierarchy the host mounts: where, what to mount it with, and our cgroup in it."""

    mountpoint: Path  # /sys/fs/cgroup/memory
    options: str  # "memory", "none,name=systemd", "cgroup2"
    own_path: str  # this process's cgroup, relative to the hierarchy's root (/process_api/ab12)


def host_hierarchies() -> list[Hierarchy]:
    """The cgroup hierarchies mounted under /sys/fs/cgroup, with this process's cgroup in each."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers or "cgroup2"] = path
    hierarchies = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        fstype, super_options = fields[separator + 1], fields[separator + 3]
        root, mountpoint = fields[3], Path(fields[4])
        if fstype not in ("cgroup", "cgroup2") or mountpoint.parent != CGROUP_ROOT or root != "/":
            continue
        if fstype == "cgroup2":
            key, options = "cgroup2", "cgroup2"
        else:
            names = [option for option in super_options.split(",") if option not in ("rw", "ro")]
            key = ",".join(names)
            options = key if not key.startswith("name=") else f"none,{key}"
        if key in own:
            hierarchies.append(Hierarchy(mountpoint, options, own[key]))
    return hierarchies


def image_enablement_links() -> list[Path]:
    """The links by which the machine image enables its services, sockets and timers (postgresql,
    prometheus, docker, apt timers ...): /etc/systemd/system/*.wants/*."""
    return sorted(link for wants in Path("/etc/systemd/system").glob("*.wants") for link in wants.iterdir()
                  if link.name.endswith((".service", ".socket", ".timer", ".path")))


def image_enabled_units() -> list[str]:
    """The units the machine image enables (image_enablement_links' names)."""
    return sorted({link.name for link in image_enablement_links()})


def _parent_death_signal() -> None:
    """In the launcher's child (unshare): die with the test process, so no systemd outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class RealSystemd:
    """A booted systemd as PID 1 of private namespaces; see the module docstring."""

    def __init__(self, shared: Path, *, files: Mapping[str, str] | None = None, enable: Sequence[str] = (),
                 keep_enabled: Sequence[str] = ()) -> None:
        """`shared`: a host directory bound read-write at SHARED_INSIDE. `files`: path inside ->
        text, written into the root before systemd starts (unit files, drop-ins). `enable`: units
        under /etc/systemd/system to link into multi-user.target.wants, so they start at boot.
        `keep_enabled`: units the image enables that this boot starts as the image would (docker.service,
        docker.socket, containerd.service), where every other one's enablement links are dropped."""
        self.shared = Path(shared).resolve()
        self.files = dict(files or {})
        self.enable = tuple(enable)
        self.keep_enabled = frozenset(keep_enabled)
        self.pid1: int | None = None
        self.booted_at = 0.0
        self._launcher: subprocess.Popen | None = None
        self._run_dir: Path | None = None
        self._cgroups: list[Path] = []

    # ---- life cycle -----------------------------------------------------------------------------

    def boot(self) -> RealSystemd:
        if os.geteuid() != 0:
            raise BootError("booting a real systemd needs root")
        for tool in ("unshare", "nsenter", "pivot_root", "mount"):
            if shutil.which(tool) is None:
                raise BootError(f"{tool} not found (util-linux / mount)")
        if not os.access(SYSTEMD, os.X_OK):
            raise BootError(f"{SYSTEMD} not found (Debian package systemd)")
        self._run_dir = Path(tempfile.mkdtemp(prefix="realsystemd-"))
        # Units of other users reach what the test shares (a fake driver, its config) as they reach a real
        # driver's files: by their modes, not by a capability (the packaged services' processes keep no
        # CAP_DAC_READ_SEARCH); pytest makes tmp_path 0700.
        self.shared.chmod(self.shared.stat().st_mode | 0o055)
        try:
            self._launch()
            self._wait_until_running()
        except BaseException:
            self.shutdown()
            raise
        return self

    def _launch(self) -> None:
        run_dir = self._run_dir
        script = run_dir / "boot.sh"
        script.write_text(BOOT_SCRIPT)
        staging = run_dir / "staging"
        self._stage(staging)
        hierarchies = host_hierarchies()
        remove_stale_cgroups(hierarchies)
        if not any(h.options in ("cgroup2", "none,name=systemd") for h in hierarchies):
            raise BootError(f"no cgroup hierarchy systemd can use under {CGROUP_ROOT}")
        Path(f"{staging}.cgroups").write_text(
            "".join(f"{h.mountpoint.name} {h.options}\n" for h in hierarchies))
        Path(f"{staging}.visible").write_text("".join(f"{path}\n" for path in hidden_host_paths()))
        Path(f"{staging}.disabled").write_text("".join(f"{link}\n" for link in image_enablement_links()
                                                       if link.name not in self.keep_enabled))
        name = f"realsystemd-{os.getpid()}-{run_dir.name.rsplit('-', 1)[-1]}"
        for hierarchy in hierarchies:
            cgroup = hierarchy.mountpoint / hierarchy.own_path.lstrip("/") / name
            cgroup.mkdir()
            self._cgroups.append(cgroup)
            for inherited in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset cgroup starts empty: no task may join
                if (cgroup / inherited).exists():
                    (cgroup / inherited).write_text((cgroup.parent / inherited).read_text())
        (run_dir / "rootfs").mkdir()
        kernel_args = [f"systemd.mask={unit}" for unit in MASKED_UNITS]
        cgroups = list(self._cgroups)

        def enter_cgroups() -> None:
            _parent_death_signal()
            for cgroup in cgroups:
                (cgroup / "cgroup.procs").write_text(f"{os.getpid()}\n")

        console = open(run_dir / "console.log", "wb")
        self.booted_at = time.time()
        self._launcher = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--mount", "--uts", "--cgroup", "--ipc", "--kill-child", "--",
             "/bin/bash", str(script), str(run_dir / "rootfs"), str(staging), str(self.shared), str(SHARED_INSIDE),
             *kernel_args],
            stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, preexec_fn=enter_cgroups,
            start_new_session=True)
        console.close()

    def _stage(self, staging: Path) -> None:
        files = {"/etc/systemd/journald.conf.d/realsystemd.conf": JOURNALD_CONF, **self.files}
        for inside, text in files.items():
            target = staging / inside.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        wants = staging / "etc/systemd/system/multi-user.target.wants"
        for unit in self.enable:
            wants.mkdir(parents=True, exist_ok=True)
            (wants / unit).symlink_to(f"/etc/systemd/system/{unit}")

    def _wait_until_running(self) -> None:
        deadline = time.monotonic() + BOOT_TIMEOUT
        while self.pid1 is None:
            self._check_launcher()
            children = Path(f"/proc/{self._launcher.pid}/task/{self._launcher.pid}/children")
            try:
                pids = children.read_text().split()
            except FileNotFoundError:
                pids = []
            if pids and _comm(int(pids[0])) == "systemd":
                self.pid1 = int(pids[0])
            elif time.monotonic() > deadline:
                raise BootError(f"systemd was not started within {BOOT_TIMEOUT} s:\n{self.console}")
            else:
                time.sleep(0.02)
        state = ""
        while time.monotonic() < deadline:
            self._check_launcher()
            state = self.run("systemctl", "is-system-running", check=False).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.05)
        raise BootError(f"systemd did not finish booting within {BOOT_TIMEOUT} s (state {state!r}):\n"
                        f"{self.console}")

    def _check_launcher(self) -> None:
        if self._launcher.poll() is not None:
            raise BootError(f"the namespace ended during boot (status {self._launcher.returncode}):\n{self.console}")

    @property
    def console(self) -> str:
        if self._run_dir is None:
            return ""
        try:
            return (self._run_dir / "console.log").read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""

    def shutdown(self) -> None:
        """SIGKILL PID 1 (the kernel kills every process of the namespace), then remove the cgroups and
        the run directory. Safe to call twice."""
        if self._launcher is not None:
            if self.pid1 is not None:
                try:
                    os.kill(self.pid1, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:  # unshare reaps PID 1, then exits
                self._launcher.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._launcher.kill()
                self._launcher.wait(timeout=10)
            self._launcher = None
        self.pid1 = None
        errors = []
        for cgroup in reversed(self._cgroups):
            try:
                _remove_cgroup_tree(cgroup)
            except OSError as error:
                errors.append(f"{cgroup}: {error}")
        self._cgroups = []
        if self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        if errors:
            raise OSError("cgroups left behind: " + "; ".join(errors))

    def __enter__(self) -> RealSystemd:
        return self.boot()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- inside -----------------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 30, input: str | None = None,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run a command inside all the namespaces (as a child of nsenter, outside systemd's units)."""
        if self.pid1 is None:
            raise BootError("not booted")
        environment = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                       "LANG": "C.UTF-8", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", **(env or {})}
        completed = subprocess.run(["nsenter", "-t", str(self.pid1), "-a", "--", *argv], capture_output=True,
                                   text=True, timeout=timeout, input=input, env=environment)
        if check and completed.returncode != 0:
            raise subprocess.CalledProcessError(completed.returncode, argv, completed.stdout, completed.stderr)
        return completed

    def host_path(self, inside: str | Path) -> Path:
        """A path inside the namespace as the host reaches it (through PID 1's root)."""
        return Path(f"/proc/{self.pid1}/root") / str(inside).lstrip("/")

    def inside(self, host_path: str | Path) -> Path:
        """Where a host path under the shared directory is inside the namespace."""
        return path_inside(self.shared, host_path)

    def write_file(self, inside: str | Path, text: str) -> None:
        target = self.host_path(inside)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def write_unit(self, name: str, text: str) -> None:
        """Write /etc/systemd/system/<name> (call daemon_reload after)."""
        self.write_file(f"/etc/systemd/system/{name}", text)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        return self.run("systemctl", *args, check=check, timeout=timeout)

    def daemon_reload(self) -> None:
        self.systemctl("daemon-reload")

    def start(self, *units: str, block: bool = False) -> None:
        """Start the units in one call (one transaction each, queued together); without `block` return
        once the jobs are queued."""
        self.systemctl("start", *([] if block else ["--no-block"]), *units)

    def journal(self, *units: str, args: Iterable[str] = ()) -> list[dict[str, object]]:
        """The journal as `journalctl -o json` gives it, one dict per entry; `units`: only their entries
        (journalctl -u: the units' own output and PID 1's records about them)."""
        argv = ["journalctl", "-o", "json", "--no-pager", *[f"--unit={unit}" for unit in units], *args]
        output = self.run(*argv).stdout
        return [json.loads(line) for line in output.splitlines() if line.strip()]

    def sync_journal(self) -> None:
        """Wait until journald has written everything it received so far (journalctl --sync)."""
        self.run("journalctl", "--sync")

    @property
    def journal_directory(self) -> Path:
        """The namespace's journal as the host reaches it (Storage=volatile: /run/log/journal)."""
        return self.host_path("/run/log/journal")


def remove_stale_cgroups(hierarchies: Iterable[Hierarchy]) -> None:
    """Remove the cgroups of earlier boots whose test process died without shutting down (named
    realsystemd-<its pid>-...); those still holding tasks stay."""
    for hierarchy in hierarchies:
        parent = hierarchy.mountpoint / hierarchy.own_path.lstrip("/")
        for cgroup in parent.glob("realsystemd-*-*"):
            owner = cgroup.name.split("-")[1]
            if owner.isdigit() and not Path(f"/proc/{owner}").exists():
                try:
                    _remove_cgroup_tree(cgroup, timeout=0)
                except OSError:
                    pass


def path_inside(shared: Path, host_path: str | Path) -> Path:
    """Where a host path under the shared directory `shared` is inside the namespace."""
    return SHARED_INSIDE / Path(host_path).resolve().relative_to(Path(shared).resolve())


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def _remove_cgroup_tree(top: Path, timeout: float = 10.0) -> None:
    """rmdir a cgroup and its children, deepest first; retried while the last tasks are exiting."""
    if not top.exists():
        return
    deadline = time.monotonic() + timeout
    while True:
        directories = sorted((path for path, _, _ in os.walk(top)), key=lambda p: p.count(os.sep), reverse=True)
        try:
            for directory in directories:
                os.rmdir(directory)
            return
        except FileNotFoundError:
            continue
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def journal_field(entry: Mapping[str, object], name: str) -> str | None:
    """A field of a `journalctl -o json` entry as text: journalctl gives binary values as byte arrays
    and repeated fields as lists."""
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, list):
        if value and isinstance(value[0], int):
            return bytes(value).decode(errors="replace")
        value = value[-1]
        if isinstance(value, list):
            return bytes(value).decode(errors="replace")
    return str(value)


__all__ = ["BootError", "JOURNALD_CONF", "MASKED_UNITS", "RealSystemd", "SHARED_INSIDE", "host_hierarchies",
           "image_enabled_units", "journal_field", "path_inside"]

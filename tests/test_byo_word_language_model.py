"""What a new user met running PyTorch's word_language_model example unmodified (it takes --seed, seeds
itself with torch.manual_seed(args.seed), default 1111, reads ./data/wikitext-2/, writes model.pt where
it stands), each fixed and checked: on synthetic records where the behaviour is pure, and with small
scripts of the project's own on the real engine where it is a run.

A. `--seeds N main.py --seed {seed}`: the arguments are one template, not a mixed input.
B. a seed that changes nothing: the verdict says so.
C. `--data NAME=/elsewhere`: the project's copy of the dataset stays out of the code snapshot.
D. a stopped sweep is `interrupted`, and says how many of how many seeds ran.
E. a dataset file the container's user cannot read is refused before the container starts.
F. the run README's by-hand command runs as the user hermetic used.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import assert_clean_error, run_cli
from hermetic.data.access import can_read, unreadable
from hermetic.data.scan import scan_tree
from hermetic.diff import diff_paths, diff_records
from hermetic.record import load_group, write_group
from hermetic.record.group import group_outcome, seeds_ran
from hermetic.record.index import entry_from_dir, group_size, ran_note
from hermetic.record.readme import render_readme
from synthetic_records import h, synthetic_record, write_synthetic_run
from run_support import diff_json, git_commit_all, hermetic_run, run_dir_of, run_dirs

# word_language_model's seeding, without torch: --seed with a default, and the script seeds itself with it.
SEEDS_ITSELF = """import argparse, random
ap = argparse.ArgumentParser()
ap.add_argument("--seed", type=int, default=1111)
args = ap.parse_args()
random.seed(args.seed)
open("model.pt", "w").write(repr([random.random() for _ in range(4)]))
"""
SLEEPER = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"


# --- A: the {seed} template ---------------------------------------------------------------------

def _templated(run_id: str, seed: int, template: list[str] | None = None, args: list[str] | None = None) -> dict:
    rec = synthetic_record(run_id, seed=seed)
    template = ["--seed", "{seed}"] if template is None else template
    rec["invocation"]["args_template"] = template
    rec["invocation"]["args"] = args if args is not None else [a.replace("{seed}", str(seed)) for a in template]
    rec["outputs"]["files"]["model.pt"]["sha256"] = h(f"model seed {seed}")
    return rec


def test_arguments_that_differ_by_the_filled_in_seed_alone_are_no_cause():
    a, b = _templated("20261129-214500-aaaaaa", 0), _templated("20261129-220000-bbbbbb", 1)
    d = diff_records(a, b)
    assert d.verdict.causes == ["seed"] and d.verdict.line.startswith("inputs differ: seed (seed 0 -> 1)")
    assert not next(s for s in d.sections if s.name == "config").differs
    # a real difference in the arguments stays one: another template...
    c = _templated("20261129-223000-cccccc", 1, ["--seed", "{seed}", "--lr", "0.2"])
    d = diff_records(a, c)
    assert d.verdict.causes[:2] == ["config", "seed"]
    # shown as typed, the template (the filled-in seed is the seed section's)
    assert "arguments '--seed {seed}' -> '--seed {seed} --lr 0.2'" in d.verdict.line
    # ...no template and other arguments...
    plain_a, plain_b = synthetic_record("20261129-214500-aaaaaa", seed=0), synthetic_record("20261129-220000-bbbbbb")
    plain_b["invocation"]["args"] = ["--epochs", "4"]
    assert diff_records(plain_a, plain_b).verdict.causes == ["config"]
    # ...or arguments that are not their template with the run's seed filled in (a hand-edited record)
    forged = _templated("20261129-220000-bbbbbb", 1, args=["--seed", "7"])
    assert diff_records(a, forged).verdict.causes[0] == "config"


def test_a_group_run_with_a_seed_template_mixes_no_inputs(tmp_path):
    root, gid = tmp_path / "runs", "20261129-210000-aaaaaa-g"
    ids = []
    for seed in (1111, 1112, 1113):
        rec = _templated(f"20261129-2100{seed - 1100:02d}-{seed:06x}", seed)
        rec["invocation"].update(group=gid)
        rec["seed"]["policy"] = "group"
        ids.append(write_synthetic_run(root, rec)["record"]["run_id"])
    write_group(root, gid, ids, planned=[1111, 1112, 1113])
    assert load_group(root / gid)["inputs"]["mixed"] == []
    other = "20261129-230000-bbbbbb-g"
    more = []
    for i, seed in enumerate((1111, 1112)):
        rec = synthetic_record(f"20261129-2300{i:02d}-{seed:06x}", seed=seed)
        rec["invocation"].update(group=other, args=["--seed", str(seed)])  # typed out by hand: no template
        rec["seed"]["policy"] = "group"
        more.append(write_synthetic_run(root, rec)["record"]["run_id"])
    write_group(root, other, more)
    assert load_group(root / other)["inputs"]["mixed"] == ["args"]  # then they are different arguments
    g = diff_paths(root / gid, root / gid)
    assert not any("more than the seed" in n for n in g.notes) and g.verdict.causes == []


# --- B: a seed that changed nothing ----------------------------------------------------------------

def test_a_seed_that_changes_no_output_is_said_to_have_had_no_effect():
    a, b = synthetic_record("20261129-214500-aaaaaa", seed=0), synthetic_record("20261129-220000-bbbbbb", seed=5)
    d = diff_records(a, b)
    assert d.verdict.kind == "inputs" and d.verdict.exit_code == 1  # the inputs do differ: as diff(1)
    assert d.verdict.line.endswith("outputs bitwise identical all the same")
    assert d.verdict.notes[0].startswith("the seed did not change the outputs: the script probably seeds "
                                         "itself with a fixed value")
    assert "--seed {seed}" in d.verdict.notes[0] and "$HERMETIC_SEED" in d.verdict.notes[0]
    # given through its arguments, the seed reached the script: it ignores it, or seeds itself anyway
    ta, tb = _templated("20261129-214500-aaaaaa", 0), _templated("20261129-220000-bbbbbb", 5)
    tb["outputs"] = ta["outputs"]
    assert "although it reached the script's arguments (--seed {seed})" in diff_records(ta, tb).verdict.notes[0]
    # outputs that differ, or another input that differs too: no such note
    b["outputs"]["files"]["model.pt"]["sha256"] = h("other model")
    assert not any("seed did not change" in n for n in diff_records(a, b).verdict.notes)
    c = synthetic_record("20261129-220000-bbbbbb", seed=5)
    c["invocation"]["args"] = ["--epochs", "4"]
    assert not any("seed did not change" in n for n in diff_records(a, c).verdict.notes)
    nothing = synthetic_record("20261129-220000-bbbbbb", seed=5)
    for r in (a, nothing):
        r["outputs"]["files"], r["metrics"]["final"] = {}, {}
    assert not any("seed did not change" in n for n in diff_records(a, nothing).verdict.notes)


# --- D: a sweep that stopped short ----------------------------------------------------------------

def _member(root: Path, gid: str, seed: int, status: str = "succeeded") -> str:
    rec = synthetic_record(f"{gid[:13]}{seed % 100:02d}-{seed:06x}", seed=seed)
    rec["invocation"]["group"] = gid
    rec["seed"]["policy"] = "group"
    rec["record"].update(status=status, exit_code=None if status == "interrupted" else 0)
    if status == "interrupted":
        rec["record"]["hermetic_exit_code"] = 143
    return write_synthetic_run(root, rec)["record"]["run_id"]


def test_a_sweep_that_stopped_short_is_interrupted_and_says_how_far_it_got(tmp_path):
    root = tmp_path / "runs"
    gid = "20261129-210000-aaaaaa-g"
    first = _member(root, gid, 0)
    write_group(root, gid, [first], planned=[0, 1, 2])  # as written after the first member
    g = load_group(root / gid)
    assert g["group"]["status"] == "interrupted" and g["group"]["seeds"] == [0, 1, 2]
    assert seeds_ran(g) == "1 of 3 seeds ran: 0"
    assert group_outcome(g) == "interrupted: 1 of 3 seeds ran, 1 succeeded"
    entry = entry_from_dir(root / gid)
    assert (group_size(entry), ran_note(entry)) == ("1/3", " (1 of 3 seeds ran)")
    # stopped between two members (no member interrupted): `runs wait` returns 130, not the members' 0
    waited = run_cli("runs", "wait", "--runs-dir", str(root), gid)
    assert (waited.returncode, waited.stdout.strip()) == (130, f"{gid}  interrupted (1 of 3 seeds ran)")
    row = run_cli("runs", "--runs-dir", str(root)).stdout
    assert f"{gid}" in row and "group×1/3 interrupted" in row
    shown = run_cli("runs", "show", "--runs-dir", str(root), gid).stdout
    assert "interrupted  (1 of 3 seeds ran: 0)" in shown
    # a member interrupted: the group too, whatever else ran
    second = _member(root, gid, 1, "interrupted")
    write_group(root, gid, [first, second], planned=[0, 1, 2])
    g = load_group(root / gid)
    assert g["group"]["status"] == "interrupted" and group_outcome(g) == "interrupted: 2 of 3 seeds ran, 1 succeeded"
    assert run_cli("runs", "wait", "--runs-dir", str(root), gid).returncode == 143  # what `run --seeds` returned
    # every seed ran: succeeded, as before
    done = "20261129-220000-bbbbbb-g"
    write_group(root, done, [_member(root, done, s) for s in (0, 1)], planned=[0, 1])
    g = load_group(root / done)
    assert (g["group"]["status"], group_outcome(g), seeds_ran(g)) == ("succeeded", "2 of 2 runs succeeded",
                                                                      "2 seeds: 0, 1")


def test_a_group_json_written_before_group_seeds_existed_still_loads(tmp_path):
    root, gid = tmp_path / "runs", "20261129-210000-aaaaaa-g"
    write_group(root, gid, [_member(root, gid, 0), _member(root, gid, 1, "interrupted")])
    path = root / gid / "group.json"
    doc = json.loads(path.read_text())
    assert "seeds" not in doc["group"] and doc["group"]["status"] == "interrupted"
    from hermetic.record.group import group_digest

    doc["group"]["status"] = "failed"  # what hermetic wrote for such a group before
    doc["group"]["group_sha256"] = group_digest(doc)
    path.write_text(json.dumps(doc))
    g = load_group(root / gid)
    assert seeds_ran(g) == "2 seeds: 0, 1" and group_outcome(g) == "1 of 2 runs succeeded"


# --- E: what the container's user may read -------------------------------------------------------

def test_read_permission_is_decided_by_owner_then_group_then_everyone_else():
    f, d = stat.S_IFREG, stat.S_IFDIR
    assert can_read(f | 0o644, 0, 0, 1000, 1000)
    assert not can_read(f | 0o600, 0, 0, 1000, 1000)
    assert can_read(f | 0o600, 1000, 0, 1000, 1000)  # the owner
    assert not can_read(f | 0o066, 1000, 1000, 1000, 1000)  # the owner's bits, not the others'
    assert can_read(f | 0o640, 0, 1000, 1000, 1000) and not can_read(f | 0o604, 0, 1000, 1000, 1000)
    assert not can_read(d | 0o744, 0, 0, 1000, 1000)  # a directory needs x to be entered...
    assert not can_read(d | 0o711, 0, 0, 1000, 1000)  # ...and r to be listed
    assert can_read(d | 0o755, 0, 0, 1000, 1000)


def test_the_scan_keeps_what_not_everyone_may_read(tmp_path):
    root = tmp_path / "ds"
    (root / "open").mkdir(parents=True)
    (root / "open" / "a.txt").write_text("a")
    (root / "closed").mkdir()
    (root / "closed" / "b.txt").write_text("b")
    (root / "secret.txt").write_text("s")
    (root / "link.txt").symlink_to("secret.txt")
    os.chmod(root / "secret.txt", 0o600)
    os.chmod(root / "closed", 0o700)
    os.chmod(root / "open" / "a.txt", 0o644)
    os.chmod(root, 0o755)
    tree = scan_tree(root)
    assert sorted(p for p, *_ in tree.restricted) == ["closed/", "link.txt", "secret.txt"]
    mine = os.getuid(), os.getgid()
    assert unreadable(tree.restricted, *mine) == []  # the owner reads them all
    other = (mine[0] + 1, mine[1] + 1)
    assert unreadable(tree.restricted, *other) == ["closed/", "link.txt", "secret.txt"]
    assert scan_tree(root, exclude={"secret.txt"}).restricted == [r for r in tree.restricted if r[0] != "secret.txt"]
    os.chmod(root, 0o700)
    assert unreadable(scan_tree(root).restricted, *other)[0] == "./"


# --- F: the README's user -----------------------------------------------------------------------

def test_the_readme_runs_as_the_user_the_run_used():
    rec = synthetic_record("20261129-214500-aaaaaa")
    rec["invocation"]["user"] = "1000:1000"
    text = render_readme(rec)
    assert "--user 1000:1000 " in text and "id -u" not in text
    assert "mkdir -p outputs && chown -R 1000:1000 outputs code-20261129-214500-aaaaaa" in text
    del rec["invocation"]["user"]  # an older record does not say: as the caller
    text = render_readme(rec)
    assert '--user "$(id -u):$(id -g)"' in text and "chown" not in text
    assert "$" + "{" not in text and "$prepare_text" not in text


# --- on the real engine ---------------------------------------------------------------------------

@pytest.mark.docker
def test_a_seed_template_sweep_and_a_script_that_seeds_itself(project):
    (project / "wlm.py").write_text(SEEDS_ITSELF)
    proc = run_cli("run", "--json", "--seeds", "2", "wlm.py", "--seed", "{seed}", cwd=project)
    assert proc.returncode == 0, proc.stderr
    group = json.loads(proc.stdout)
    assert group["inputs"]["mixed"] == [] and group["flags"] == []
    gid = group["group"]["group_id"]
    assert "MIXED" not in run_cli("runs", "show", gid, cwd=project).stdout
    same = run_cli("diff", gid, gid, cwd=project)
    assert "more than the seed" not in same.stdout, same.stdout
    a, b = (project / "runs" / m["run_id"] for m in group["members"])
    code, d = diff_json(a, b)
    assert code == 1 and d["verdict"]["causes"] == ["seed"], d["verdict"]  # not config (arguments ...) first
    # B: without the template the script seeds itself with its default: the seed never reaches it
    _, plain = hermetic_run(project, "wlm.py")
    _, five = hermetic_run(project, "--seed", "5", "wlm.py")
    code, d = diff_json(run_dir_of(project, plain), run_dir_of(project, five))
    assert code == 1 and d["verdict"]["kind"] == "inputs" and d["verdict"]["causes"] == ["seed"]
    assert d["verdict"]["line"].endswith("outputs bitwise identical all the same")
    assert d["verdict"]["notes"][0].startswith("the seed did not change the outputs")
    text = run_cli("diff", str(run_dir_of(project, plain)), str(run_dir_of(project, five))).stdout
    assert "note: the seed did not change the outputs" in text


@pytest.mark.docker
def test_a_dataset_taken_from_elsewhere_keeps_the_project_copy_out_of_the_code(project, tmp_path):
    subprocess.run(["git", "-C", str(project), "init", "-q", "-b", "main"], check=True)
    (project / ".gitignore").write_text("runs/\n")  # data/ tracked in git, as word_language_model's is
    git_commit_all(project)
    assert "data/train-x.f32" in subprocess.run(["git", "-C", str(project), "ls-files"], capture_output=True,
                                                text=True, check=True).stdout
    elsewhere = tmp_path / "elsewhere" / "copy"
    shutil.copytree(project / "data", elsewhere)
    _, normal = hermetic_run(project, "train.py")
    _, moved = hermetic_run(project, "--data", f"logreg={elsewhere}", "train.py")
    for rec in (normal, moved):
        assert not [f for f in rec["code"]["snapshot"]["files"] if f.startswith("data/")]
    assert moved["code"]["snapshot"] == normal["code"]["snapshot"]
    code, d = diff_json(run_dir_of(project, normal), run_dir_of(project, moved))
    assert code == 0 and d["verdict"]["kind"] == "identical", d["verdict"]


@pytest.mark.docker
def test_a_dataset_file_the_container_user_cannot_read_is_refused_before_the_container(project):
    victim = project / "data" / "train-y.u8"
    os.chmod(victim, 0o600)
    before = run_dirs(project)
    if os.getuid() == 0:  # the case as reported: hermetic as root, the script as the image's user
        proc = run_cli("run", "train.py", cwd=project)
        assert_clean_error(proc, 65, "dataset logreg: the script runs as 1000:1000, which cannot read 1 of",
                           "train-y.u8", "no container was started")
        assert f"hermetic: hint: let everyone read it: chmod -R a+rX {project / 'data'}" in proc.stderr
        assert run_dirs(project) == before
        os.chown(victim, 1000, 1000)  # its owner may read it: not refused
    _, rec = hermetic_run(project, "train.py")  # as anyone else, the container's user is the caller: the owner
    assert rec["record"]["status"] == "succeeded"


@pytest.mark.docker
def test_stopping_a_sweep_says_interrupted_and_how_many_seeds_ran(project):
    (project / "sleeper.py").write_text(SLEEPER)
    proc = run_cli("run", "--detach", "--seeds", "3", "sleeper.py", cwd=project)
    assert proc.returncode == 0, proc.stderr
    gid = proc.stdout.strip()
    _wait_for_a_member_to_start(project, gid)
    stopped = run_cli("stop", gid, cwd=project)
    assert (stopped.returncode, stopped.stdout.strip()) == (0, f"{gid}: interrupted (1 of 3 seeds ran)"), stopped
    waited = run_cli("runs", "wait", gid, cwd=project)
    assert (waited.returncode, waited.stdout.strip()) == (143, f"{gid}  interrupted (1 of 3 seeds ran)")
    group = json.loads((project / "runs" / gid / "group.json").read_text())
    assert group["group"]["status"] == "interrupted" and len(group["group"]["seeds"]) == 3
    assert [m["status"] for m in group["members"]] == ["interrupted"]
    assert "group×1/3 interrupted" in run_cli("runs", cwd=project).stdout
    assert "interrupted  (1 of 3 seeds ran: " in run_cli("runs", "show", gid, cwd=project).stdout


@pytest.mark.docker
def test_ctrl_c_on_a_sweep_says_interrupted_and_how_many_seeds_ran(project):
    (project / "sleeper.py").write_text(SLEEPER)
    p = subprocess.Popen([sys.executable, "-m", "hermetic", "run", "--seeds", "3", "sleeper.py"], cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        gid = _wait_for_group_dir(project, p)
        _wait_for_a_member_to_start(project, gid, p)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert f"group {gid}: interrupted: 1 of 3 seeds ran, 0 succeeded -> " in out, out


def _wait_for_group_dir(project: Path, p: subprocess.Popen, timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [d.name for d in (project / "runs").glob("*") if d.is_dir() and (d / ".running.lock").exists()
                 and not (d / "run.json").exists() and not (d / "argv.txt").exists()]
        if found:
            return found[0]
        assert p.poll() is None, p.communicate()
        time.sleep(0.05)
    raise AssertionError("no group directory")


def _wait_for_a_member_to_start(project: Path, gid: str, p: subprocess.Popen | None = None,
                                timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for log in (project / "runs").glob("*/logs/stdout.log"):
            if log.parent.parent.name != gid and "started" in log.read_text():
                return
        assert p is None or p.poll() is None, p.communicate()
        time.sleep(0.05)
    raise AssertionError("no member started")

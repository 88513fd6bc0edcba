"""The tree as a newcomer reads it: every top-level folder says what it holds in its README's first
line, the README's layout table names every top-level path git tracks (and only paths that exist),
results/README.md indexes every run, and neither study databases nor patches are tracked."""
import fnmatch
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return out.splitlines()


def _layout_paths() -> list[str]:
    """The backticked paths in the README's layout table (the `| path | what it holds |` table)."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| path | what it holds |"):].split("\n\n")[0]
    return re.findall(r"`([^`\s]+)`", table)


def test_every_top_level_folder_says_what_it_holds():
    folders = sorted({p.split("/")[0] for p in _tracked() if "/" in p})
    for folder in folders:
        readme = ROOT / folder / "README.md"
        assert readme.exists(), f"{folder}/ has no README.md"
        first = readme.read_text().split("\n", 1)[0].strip()
        assert len(first) > 20, f"{folder}/README.md: its first line should say what the folder holds"


def test_the_layout_table_matches_the_tracked_tree():
    named = _layout_paths()
    tops = {p.split("/")[0] for p in _tracked()} - {"README.md", ".gitignore"}
    heads = [n.split("/")[0] for n in named]
    missing = sorted(t for t in tops if not any(fnmatch.fnmatch(t, h) for h in heads))
    assert not missing, f"README.md's layout table does not name {missing}"
    # Paths from the root (those with a folder) must exist; a bare name (api.py) is a file of its row's folder.
    gone = [n for n in named if "/" in n and "<" not in n and not (ROOT / n).exists()]
    assert not gone, f"README.md's layout table names paths that do not exist: {gone}"


def test_the_results_index_lists_every_run():
    index = (ROOT / "results" / "README.md").read_text()
    runs = sorted({str(pathlib.Path(p).parent.relative_to("results")) for p in _tracked()
                   if re.fullmatch(r"results/[^/]+/[^/]+/README\.md", p)})
    unlisted = [run for run in runs if f"]({run}/README.md)" not in index]
    assert not unlisted, f"results/README.md does not index {unlisted}"


def test_no_study_database_or_patch_is_tracked():
    assert [p for p in _tracked() if p.endswith((".db", ".patch"))] == []

"""The concept pages docs/semantics.md and docs/overlap.md stay short (issue 53), and what left
them lives on docs/evidence.md: text checks only, no build."""

from __future__ import annotations

import pathlib
import re

import pytest

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
#: Prose words per concept page, counted as the issue counts them (fences and display math out).
#: About 2,500 each after the cut; the rest is headroom for a paragraph or two.
WORD_BUDGET = 2750


def prose_words(text: str) -> int:
  text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)  # front matter
  text = re.sub(r"^(`{3,})[^\n]*\n.*?^\1[ \t]*$", "", text, flags=re.S | re.M)  # every fenced block
  text = re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)  # display math
  return len(text.split())


def page(name: str) -> str:
  return (DOCS / f"{name}.md").read_text()


@pytest.mark.parametrize("name", ["semantics", "overlap"])
def test_concept_page_is_within_its_word_budget(name):
  words = prose_words(page(name))
  assert words <= WORD_BUDGET, f"docs/{name}.md has {words} prose words (budget {WORD_BUDGET}): move evidence to docs/evidence.md"


@pytest.mark.parametrize("name", ["semantics", "overlap"])
def test_concept_page_links_to_its_evidence(name):
  assert re.search(r"\(evidence\.md#evidence-[a-z-]+\)", page(name)), f"docs/{name}.md does not link to docs/evidence.md"


def test_evidence_page_is_in_the_reference_toctree_next_to_limitations():
  index = page("index")
  reference = re.search(r":caption: Reference\n.*?```", index, flags=re.S)
  assert reference and re.search(r"^limitations\nevidence$", reference.group(0), flags=re.M)


def test_every_label_linked_to_exists():
  """Labels referenced anywhere in docs/ ((page.md#label), (#label), {ref}`... <label>`) of the
  semantics, overlap and evidence pages are defined on some page."""
  texts = {p.name: p.read_text() for p in DOCS.glob("*.md")}
  defined = {m for t in texts.values() for m in re.findall(r"^\(([a-z0-9-]+)\)=$", t, flags=re.M)}
  prefixes = ("semantics-", "overlap-", "evidence-")
  used = set()
  for t in texts.values():
    used |= set(re.findall(r"\]\((?:[a-z_]+\.md)?#([a-z0-9-]+)\)", t))
    used |= set(re.findall(r"\{ref\}`[^`<]*<([a-z0-9-]+)>`", t))
  missing = sorted(label for label in used if label.startswith(prefixes) and label not in defined)
  assert not missing, f"labels linked to but defined nowhere: {missing}"


def test_overlap_page_says_how_to_run_it_first():
  text = page("overlap")
  headings = re.findall(r"^## (.+)$", text, flags=re.M)
  assert headings[0] == "Running it" and headings.index("Running it") < headings.index("What happens in a step")
  running = text.split("## Running it", 1)[1].split("\n## ", 1)[0]
  for needed in ("python -m diloco_core.launch --processes 2", "--coordinator", "--num-processes", "--process-id", "--elastic"):
    assert needed in running, f"Running it lacks {needed!r}"


@pytest.mark.parametrize("name", ["overlap", "evidence", "semantics"])
def test_every_glue_key_in_the_prose_is_glued_on_the_same_page(name):
  """A glued value shows only on the page that computes it: prose moved off a page must not
  take its glue references along."""
  text = page(name)
  shown = set(re.findall(r"\{glue(?::[a-z]+)?\}`([A-Za-z0-9_]+)", text))
  shown |= set(re.findall(r"^```\{glue(?::[a-z]+)?\} ([A-Za-z0-9_]+)", text, flags=re.M))
  glued = set(re.findall(r"""glue\(\s*["']([A-Za-z0-9_]+)["']""", text))
  assert shown <= glued, f"docs/{name}.md shows glue keys it does not compute: {sorted(shown - glued)}"

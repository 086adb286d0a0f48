"""pytest also collects the code examples of the docs site's pages (tests/doc_examples.py runs them)."""

from tests.doc_examples import DOCS

pytest_collect_file = DOCS.pytest()

"""docs/writing-a-store.md's DictStore, taken from the page, so that the contract
(tests/docs_examples/test_dict_store.py) proves the code a reader copies."""

from tests.docs_blocks import run_page_code

DictStore = run_page_code("docs/writing-a-store.md", {"__name__": __name__}, 0)["DictStore"]

"""docs/writing-a-store.md's contract test, from the page, run against the page's DictStore
(tests/docs_examples/dict_store.py) where the page names a module of the reader's."""

from tests.docs_blocks import page_code

_namespace: dict[str, object] = {"__name__": __name__}
exec(
    page_code("docs/writing-a-store.md", 1).replace(
        '"myproject.stores.DictStore"', '"tests.docs_examples.dict_store.DictStore"'
    ),
    _namespace,
)
TestDictStore = _namespace["TestDictStore"]

import pytest

from quantkit.calibration.task_types import infer_task

LONG_DOC = "The committee met on Tuesday and discussed the budget for the coming year. " * 30


@pytest.mark.parametrize("text, shape, task", [
    ("Translate into French: good morning", "chat", "translation"),
    ("请把这句话翻译成英文：今天天气很好", "chat", "translation"),
    ("Summarize the following email thread.\n" + LONG_DOC, "chat", "summarisation"),
    ("请总结这篇文章的要点", "chat", "summarisation"),
    ("Extract all dates and amounts as JSON: paid $300 on 3 May", "chat", "extraction"),
    ("提取文中所有人名：李鹏在北京考察", "chat", "extraction"),
    ("Is this review positive or negative? Great phone.", "chat", "classification"),
    ("判断情感：这本书很好看", "chat", "classification"),
    ("```python\nprint(1)\n```\nwhy does this fail?", "chat", "code"),
    ("Write a function that reverses a linked list", "chat", "code"),
    (LONG_DOC + "\nBased on the text above, who chaired the meeting?", "chat", "qa_document"),
    ("def f(x):\n    return x\nclass A:\n    pass\nimport os\n", "text", "code"),
    ("Calculate the compound interest on 1000 at 5%", "chat", "math"),
    ("If x = 3 and y = 4, what is the hypotenuse?", "chat", "math"),
    ("What is the capital of France?", "chat", "chat"),
    (LONG_DOC, "text", "text"),
])
def test_rules(text, shape, task):
    assert infer_task(text, shape) == task


def test_document_words_do_not_decide_the_task():
    manual = ":翻译:\n\n 司延腾\n\n" + "内核文档说明。" * 400 + "\n\n根据上面的文档回答：这一部分讲了什么？"
    assert infer_task(manual, "chat") == "qa_document"
    article = "Summarise this.\n" + LONG_DOC + "The translation of the treaty was late. " + LONG_DOC
    assert infer_task(article, "chat") == "summarisation"


def test_rules_agree_with_the_labelled_default_log(default_rows):
    """The embedded log carries task labels: the rules alone recover >= 90% of them."""
    agree = 0
    for row in default_rows:
        instruction = "\n".join(m["content"] for m in row["messages"] if m["role"] in ("system", "user"))
        agree += infer_task(instruction, "chat") == row["task"]
    assert agree / len(default_rows) >= 0.90

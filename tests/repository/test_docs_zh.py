"""The Chinese guides (docs/zh/) stay in step with the English ones (docs/), where that can be
checked without reading the prose: the same code once comments are set aside, the same figures
cited from the same RESULTS.md sections, links to the same pages, every flag the English page
names, and the same sections. The site's nav and the Chinese README list every Chinese guide."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
ZH = ROOT / "docs" / "zh"
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
COMMENT = re.compile(r"\s+#\s.*$")      # a trailing comment: `# ` after a space (a YAML key or a regex has no space)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").resolve()


#: Chinese pages with no English page to be in step with: the glossary is the Chinese terms themselves
CHINESE_ONLY = ("glossary.md",)


def guides() -> list[tuple[Path, Path]]:
    """(English page, Chinese page) pairs."""
    return [(ROOT / "docs" / zh.name, zh) for zh in sorted(ZH.glob("*.md")) if zh.name not in CHINESE_ONLY]


def code(text: str) -> list[str]:
    """Every code line of a page, in order, its trailing comment (translated prose) left out."""
    return [COMMENT.sub("", line).rstrip() for block in FENCE.findall(text) for line in block.splitlines()]


def links(page: Path, text: str) -> tuple[list[tuple[str, str]], set[Path]]:
    """The RESULTS.md citations ``(figure, section)`` in order, and the other pages linked, each
    as its English page (a Chinese guide stands for the English one it translates)."""
    cited, pages = [], set()
    for label, target in LINK.findall(FENCE.sub("", text)):
        path, _, anchor = target.partition("#")
        if "://" in path or not path:
            continue
        resolved = (page.parent / path).resolve()
        if resolved == RESULTS:
            cited.append((label if any(c.isdigit() for c in label) else "", anchor))
        else:
            pages.add(ROOT / "docs" / resolved.name if resolved.parent == ZH else resolved)
    return cited, pages


def headings(text: str) -> list[str]:
    return [line.split(" ", 1)[0] for line in FENCE.sub("", text).splitlines() if re.match(r"#{1,6} ", line)]


def differences(en_page: Path, zh_page: Path, zh: str | None = None) -> list[str]:
    """What the Chinese page (``zh``: its text, else the file's) lacks or has otherwise than the
    English one."""
    en = en_page.read_text(encoding="utf-8")
    zh = zh_page.read_text(encoding="utf-8") if zh is None else zh
    name, problems = zh_page.name, []
    if code(zh) != code(en):
        problems += [f"{name}: code line {line!r} not as in the English page" for line in code(en) if line not in code(zh)]
        problems += [f"{name}: code line {line!r} is not in the English page" for line in code(zh) if line not in code(en)]
        problems = problems or [f"{name}: code lines in another order than the English page"]
    (en_cited, en_pages), (zh_cited, zh_pages) = links(en_page, en), links(zh_page, zh)
    if zh_cited != en_cited:
        problems.append(f"{name}: cites {zh_cited} from RESULTS.md, the English page {en_cited}")
    problems += [f"{name}: no link to {p.relative_to(ROOT)}" for p in sorted(en_pages - zh_pages)]
    flags = set(FLAG.findall(FENCE.sub("", en)))
    problems += [f"{name}: does not name {flag}" for flag in sorted(flags - set(FLAG.findall(zh)))]
    if headings(zh) != headings(en):
        problems.append(f"{name}: sections {headings(zh)}, the English page {headings(en)}")
    return problems


def test_the_key_guides_have_a_chinese_page():
    assert {zh.name for _, zh in guides()} >= {"quantize.md", "evaluate.md", "vllm.md", "engine.md", "python-api.md"}
    assert all(en.is_file() for en, _ in guides())


def test_each_chinese_guide_is_in_step_with_its_english_page():
    problems = [p for en, zh in guides() for p in differences(en, zh)]
    assert problems == []
    assert sum(len(code(en.read_text(encoding="utf-8"))) for en, _ in guides()) >= 20   # the checks saw code


def test_each_chinese_guide_links_its_english_page_and_is_in_the_site_and_the_readme():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    chinese = next(item["中文"] for item in nav if isinstance(item, dict) and "中文" in item)
    in_nav = {path for entry in chinese for path in entry.values()}
    readme = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    for en, zh in guides():
        assert f"](../{en.name})" in zh.read_text(encoding="utf-8"), zh.name
    for zh in sorted(ZH.glob("*.md")):
        assert f"docs/zh/{zh.name}" in in_nav, zh.name
        assert f"](docs/zh/{zh.name})" in readme, zh.name


def test_a_guide_out_of_step_is_seen():
    en, zh = ROOT / "docs" / "quantize.md", ZH / "quantize.md"
    text = zh.read_text(encoding="utf-8")
    cases = {   # a change to the Chinese page -> the start of the problem it makes
        "--calib DIR --out OUT": "quantize.md: code line 'quantkit convert M --recipe w4a16-g64-gptq --calib DIR "
                                 "--out OUT' not as in the English page",
        "[2.23x](../../benchmarks/RESULTS.md#calibration-sampler)": "quantize.md: cites",
        "[指南](../mixed-precision.md)": "quantize.md: no link to docs/mixed-precision.md",
        "`--resume`": "quantize.md: does not name --resume",
        "### 内存": "quantize.md: sections",
    }
    changed = {"--calib DIR --out OUT": "--calib DIR --out  OUT", "`--resume`": "`--continue`", "### 内存": "内存"}
    assert differences(en, zh, text) == []
    for old, problem in cases.items():
        assert text.count(old) >= 1, old
        planted = text.replace(old, changed.get(old, "2.23x" if "2.23x" in old else "指南"))
        found = differences(en, zh, planted)
        assert len(found) >= 1 and found[0].startswith(problem), (old, found)

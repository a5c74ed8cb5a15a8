"""The docs site's build hook, and the CLI reference it generates.

mkdocs.yml names this file under `hooks:`. Two things happen at build time:

- The pages keep the paths they have in the repository (`README.md`, `docs/quantize.md`,
  `benchmarks/RESULTS.md`), so a relative link such as `../benchmarks/RESULTS.md#kv-cache`
  resolves the same way on GitHub and in the site, and `mkdocs build --strict` checks it.
- `docs/cli.md` is rendered from the typer app (`quantkit.cli:app`) with typer's own docs
  utility, so the CLI reference cannot drift from the flags.

Run as a script to print the CLI reference:

    PYTHONPATH=. python scripts/docs_site.py > cli.md
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Pages outside docs/ that the site carries, at their repository paths.
EXTRA_PAGES = ("README.md", "README.zh-CN.md", "benchmarks/RESULTS.md")
CLI_PAGE = "docs/cli.md"

CLI_INTRO = (
    "Generated from the typer app (`quantkit.cli:app`) when the site is built; "
    "`quantkit COMMAND --help` prints the same text.\n\n"
)


def render_cli_reference() -> str:
    """Markdown for every command of the `quantkit` CLI, from the app itself."""
    import click
    import typer
    import typer.cli

    from quantkit.cli import app

    command = typer.main.get_command(app)
    ctx = click.Context(command, info_name="quantkit")
    body = typer.cli.get_docs_for_click(obj=command, ctx=ctx, name="quantkit", title="CLI reference")
    title, _, rest = body.partition("\n\n")
    return f"{title}\n\n{CLI_INTRO}{rest}"


def on_files(files, config):
    """Rebuild the file list with repository paths, plus the generated CLI reference."""
    from mkdocs.structure.files import File, Files

    site_dir = config["site_dir"]
    urls = config["use_directory_urls"]
    docs_dir = Path(config["docs_dir"]).resolve()
    kept = []
    for f in files:
        if not Path(f.abs_src_path).resolve().is_relative_to(docs_dir):
            kept.append(f)  # the theme's own assets
            continue
        if f.src_uri == "cli.md":
            raise SystemExit("docs/cli.md is generated at build time: remove the checked-in copy")
        kept.append(File(f"docs/{f.src_uri}", str(ROOT), site_dir, urls))
    for page in EXTRA_PAGES:
        kept.append(File(page, str(ROOT), site_dir, urls))
    kept.append(File.generated(config, CLI_PAGE, content=render_cli_reference()))
    return Files(kept)


if __name__ == "__main__":
    print(render_cli_reference())

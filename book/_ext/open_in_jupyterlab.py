"""An "Open in JupyterLab" link at the top of every notebook page, to the same notebook in the JupyterLab that
`make lab` starts (it serves notebooks/ at the root of http://localhost:8888, JupyterLab's default address)."""
from __future__ import annotations

from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform


class OpenInJupyterLab(SphinxTransform):
    """Put the link, and a line saying where it leads, right under the notebook's title."""

    default_priority = 501

    def apply(self, **kwargs) -> None:
        source = Path(self.env.doc2path(self.env.docname))
        if source.suffix != ".ipynb":
            return
        served = Path(self.env.srcdir, self.config.jupyterlab_root)
        url = self.config.jupyterlab_url + source.relative_to(served).as_posix()
        link = nodes.reference("", "Open in JupyterLab", refuri=url, classes=["open-in-jupyterlab"])
        note = nodes.container(
            "", nodes.paragraph(
                "", "", link,
                nodes.Text(": with "), nodes.literal("", "make lab"), nodes.Text(
                    " running, this opens the notebook in it, to run it yourself (JupyterLab serves notebooks/ at "),
                nodes.literal("", self.config.jupyterlab_url.split("/lab/")[0]), nodes.Text(
                    "; if it asks for a token or chose another port, open the address that make lab printed first). "
                    "This page shows the outputs stored in the notebook; nothing was run to build it.")),
            classes=["jupyterlab-note"])
        section = next(iter(self.document.findall(nodes.section)), None)
        if section is not None and section.children and isinstance(section[0], nodes.title):
            section.insert(1, note)
        else:
            self.document.insert(0, note)


def setup(app):
    app.add_config_value("jupyterlab_url", "http://localhost:8888/lab/tree/", "html", types=[str])
    app.add_config_value("jupyterlab_root", "notebooks", "html", types=[str])
    app.add_transform(OpenInJupyterLab)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

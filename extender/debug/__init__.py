"""The extender's debug UI: what its /debug endpoints answer, as JSON documents and HTML pages.

`extender.debug.routes` gathers the extender's state into the inputs below and is the only
module that imports this package. Everything here is pure (no I/O, no service objects):

- `occupants_by_gpu`: the pods holding each GPU of a node (the views' input is `extender.state.snapshot.TrackedNode`);
- `node_documents`: GET /debug/topology and /debug/topology/{node} as JSON-ready dicts;
- `decision_documents`: GET /debug/explain/{ns}/{pod} and POST /debug/what-if as JSON-ready dicts;
- `geometry`: where each vertex of a node's graph goes in the drawing (the radial layout);
- `palette`: the colours and words of the legend, shared by the drawing and the pages;
- `svg`: the node's graph drawn as inline SVG;
- `pages`: the self-contained HTML pages, rendered from the Jinja2 templates in `templates/`.
"""

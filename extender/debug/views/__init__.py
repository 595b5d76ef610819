"""The debug UI: JSON documents, HTML pages and SVG drawings of the extender's state, from a snapshot."""

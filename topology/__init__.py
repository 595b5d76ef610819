"""The pure core: GPU topology model, parsers, codecs, scores and placement. No I/O frameworks."""

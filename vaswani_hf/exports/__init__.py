"""Other engines: exports to CTranslate2 and ONNX (and ONNX Runtime decoding), imports from Marian and FSMT."""

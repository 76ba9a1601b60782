"""The command-line tools: vaswani-translate, vaswani-export, vaswani-attention, vaswani-push."""

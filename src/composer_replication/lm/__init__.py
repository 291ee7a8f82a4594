"""The language model, below everything that runs one: loading (``models``), chat rendering
(``chat``), tool-capable chat templates (``chat_templates``, ``templates/``) and shared-prefix
forwards (``prefix``)."""

"""How a claimed row becomes an email on the wire: templates, providers, failure handling.

Nothing here touches the outbox tables; the runtime hands in a row and gets back a result or
a classified failure.
"""

"""`leasebox.feedback`: what the mail services report after they accepted a message.

Receivers for the five built-in services' webhooks (`asgi.FeedbackApp`, `leasebox feedback
serve`, and a Django view), each checking its service's signature; the events in one
vocabulary (`events`), stored once and linked to their messages, feeding the suppression
list and the reputation counters (`recording`).
"""

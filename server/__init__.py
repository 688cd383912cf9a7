"""The local OpenAI-compatible server (omnidraft.server): `omnidraft serve`, and
Settings → Local server in the app.

* service.py  EngineService: the server's requests to the engine worker and their
              events back, one turn at a time, first come first served, bounded wait
* api.py      the Starlette app: /v1/models, /v1/chat/completions, /v1/completions,
              request checks and OpenAI-style errors, server-sent events
* runner.py   ServerThread (uvicorn in its own thread and loop), AppServer (inside
              the app, on its worker), serve (`omnidraft serve`, its own worker)

Qt-free and torch-free: it runs in the GUI process too.
"""

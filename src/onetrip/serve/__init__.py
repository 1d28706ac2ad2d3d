"""The OpenAI-compatible HTTP server over the continuous-batching scheduler (``onetrip serve``).

    from onetrip.serve import EngineRunner
    from onetrip.serve.app import create_app          # needs fastapi (pip install 'onetrip[serve]')

    runner = EngineRunner(Scheduler(model, eos_ids=tokenizer.eos_ids), tokenizer).start()   # the engine thread
    uvicorn.run(create_app(runner, "my-model"), port=8000)
    runner.shutdown()

``runner.py`` is the engine thread (it owns the Scheduler); ``protocol.py`` the request
bodies and their checks; ``app.py`` the FastAPI routes; ``command.py`` the command.
docs/serving-http.md lists the endpoints and what is supported.
"""

from .runner import Delta, EngineRunner, EngineStopped

__all__ = ["Delta", "EngineRunner", "EngineStopped"]

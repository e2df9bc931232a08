"""dispatch's ApiClient sends dict bodies as they are; the generated client's models still go its way."""

from __future__ import annotations

import json

from kubernetes_asyncio.client import Configuration, V1ObjectMeta

from dispatch._kubeclient import client_for


async def test_a_dict_body_is_sent_as_it_is_and_a_model_is_still_serialized() -> None:
    api = client_for(Configuration(host="https://127.0.0.1:1"))
    try:
        body = {"metadata": {"name": "a", "resourceVersion": "7"}, "status": {"n": [1, 2.5, None, True]}}
        assert api.sanitize_for_serialization(body) is body
        assert json.loads(json.dumps(api.sanitize_for_serialization(body))) == body
        model = V1ObjectMeta(name="a", labels={"x": "y"})
        assert api.sanitize_for_serialization(model) == {"name": "a", "labels": {"x": "y"}}
        assert api.sanitize_for_serialization([model]) == [{"name": "a", "labels": {"x": "y"}}]
    finally:
        await api.close()

"""The broker registry both load managers share, as Pulsar's BrokerRegistry: one ephemeral znode per live
broker at `/loadbalance/brokers/<brokerId>` (brokerId = `<host>:<webServicePort>`), whose value is the
broker's registration (the modular load manager writes its LocalBrokerData load report there; the
extensible one its BrokerLookupData). Readers here need only the fields every registration carries:
`webServiceUrl`, `pulsarServiceUrl`, and ours, `name` and `broker` (host:port of the Pulsar protocol).
"""
from __future__ import annotations

from typing import Any

from clusters.metadata.codec import decode_json_object

BROKERS_PATH = "/loadbalance/brokers"


class BrokerRegistry:
    """Reads of the registry through a broker's metadata session (clusters/metadata/store.py)."""

    def __init__(self, store: Any):
        self.store = store

    async def ids(self) -> list[str]:
        """Every live broker's brokerId, sorted."""
        return sorted(await self.store.children(BROKERS_PATH))

    async def registration(self, broker_id: str) -> dict[str, Any] | None:
        """One broker's registration, None if it is not live (or its value is not a JSON object)."""
        got = await self.store.get_or_none(f"{BROKERS_PATH}/{broker_id}")
        doc = decode_json_object(got[0] if got else b"")
        return doc or None

    async def available(self) -> dict[str, dict[str, Any]]:
        """brokerId -> registration, for every live broker with a readable registration."""
        out: dict[str, dict[str, Any]] = {}
        for key in await self.ids():
            doc = await self.registration(key)
            if doc is not None:
                out[key] = doc
        return out

    async def live(self) -> list[dict[str, str]]:
        """Every registered broker as the admin API names it: {"id" (brokerId), "web" (host:port of its
        web service), "web_url", "service_url", "name"}; a registration not yet readable still counts."""
        out = []
        for key in await self.ids():
            data = await self.registration(key) or {}
            web_url = data.get("webServiceUrl") or data.get("web_url")
            if not isinstance(web_url, str):
                web_url = f"http://{key}"
            service_url = data.get("pulsarServiceUrl") or data.get("service_url") or ""
            out.append({"id": key, "web": web_url.split("://", 1)[-1], "web_url": web_url,
                        "service_url": str(service_url), "name": str(data.get("name", ""))})
        return out

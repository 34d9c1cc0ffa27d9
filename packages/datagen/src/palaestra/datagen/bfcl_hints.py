"""Argument hints for BFCL's eight environments: values that make calls meaningful.

Each environment maps ``param`` (or ``tool.param``) to ``fn(instance, rng,
chosen) -> candidate values`` read from the live state (files in the current
directory, ticket ids, stock symbols, ...). Where two parameters must fit
together (a flight route, a pair of zipcodes), the valid pairs are found once
by probing the environment itself on a scratch instance and cached.
Hints only propose values: every call is still executed and kept only if it
succeeds.
"""

from __future__ import annotations

import copy
from functools import cache

CITIES = [
    "Rivermist",
    "Stonebrook",
    "Maplecrest",
    "Silverpine",
    "Shadowridge",
    "Sunset Valley",
    "Oakendale",
    "Willowbend",
    "Crescent Hollow",
    "Autumnville",
    "Pinehaven",
    "Greenfield",
    "San Francisco",
    "Los Angeles",
    "New York",
    "Chicago",
    "Boston",
    "Beijing",
    "Hong Kong",
    "Rome",
    "Tokyo",
    "London",
    "Paris",
]
NEW_NAMES = ["notes.txt", "summary.md", "backup", "archive_2024", "draft.txt"]


def _cwd(inst):
    return inst._current_dir.contents


def _files(inst):
    return [n for n, o in _cwd(inst).items() if type(o).__name__ == "File"]


def _dirs(inst):
    return [n for n, o in _cwd(inst).items() if type(o).__name__ == "Directory"]


def _words(inst):
    words = []
    for o in _cwd(inst).values():
        words += [w.strip(".,!") for w in getattr(o, "content", "").split() if len(w) > 3]
    return words[:20] or ["report"]


def _up(inst):
    return [".."] if inst._current_dir.parent is not None else []


GorillaFileSystem = {
    "file_name": lambda i, r, c: _files(i),
    "file_name1": lambda i, r, c: _files(i),
    "file_name2": lambda i, r, c: [f for f in _files(i) if f != c.get("file_name1")],
    "touch.file_name": lambda i, r, c: [n for n in NEW_NAMES if n not in _cwd(i) and "." in n],
    "echo.file_name": lambda i, r, c: _files(i) + ["notes.txt"],
    "source": lambda i, r, c: _files(i) + _dirs(i),
    "destination": lambda i, r, c: [d for d in _dirs(i) if d != c.get("source")] + ["renamed.txt"],
    "folder": lambda i, r, c: _dirs(i) + _up(i),
    "dir_name": lambda i, r, c: _dirs(i),
    "mkdir.dir_name": lambda i, r, c: [n for n in NEW_NAMES if n not in _cwd(i) and "." not in n],
    "pattern": lambda i, r, c: _words(i),
    "name": lambda i, r, c: [n[:4] for n in _cwd(i)] or ["txt"],
    "path": lambda i, r, c: ["."],
    "mode": lambda i, r, c: ["l", "w", "c"],
    "lines": lambda i, r, c: [2, 3, 5],
}

MathAPI = {
    "numbers": lambda i, r, c: [[r.randint(1, 50) for _ in range(r.randint(2, 5))] for _ in range(3)],
    "si_unit_conversion.unit_in": lambda i, r, c: ["m", "km", "g", "kg", "s", "min"],
    "si_unit_conversion.unit_out": lambda i, r, c: {
        "m": ["cm", "km"],
        "km": ["m"],
        "g": ["kg"],
        "kg": ["g"],
        "s": ["min"],
        "min": ["s"],
    }.get(c.get("unit_in"), ["m"]),
    "imperial_si_conversion.unit_in": lambda i, r, c: ["inch", "cm", "mile", "km", "pound", "kg"],
    "imperial_si_conversion.unit_out": lambda i, r, c: {
        "inch": ["cm"],
        "cm": ["inch"],
        "mile": ["km"],
        "km": ["mile"],
        "pound": ["kg"],
        "kg": ["pound"],
    }.get(c.get("unit_in"), ["cm"]),
    "precision": lambda i, r, c: [2, 3],
    "base": lambda i, r, c: [2.0, 10.0],
    "b": lambda i, r, c: [r.choice([2.0, 4.0, 5.0, 8.0])],
}

MessageAPI = {
    "user_id": lambda i, r, c: list(i.user_map.values()),
    "receiver_id": lambda i, r, c: [v for v in i.user_map.values() if v != i.current_user],
    "user": lambda i, r, c: list(i.user_map),
    "user_name": lambda i, r, c: ["Eve", "Frank", "Grace"],
    "keyword": lambda i, r, c: (
        [w for box in i.inbox for msgs in box.values() for m in msgs for w in m.split() if len(w) > 3][:10]
        or ["meeting"]
    ),
}

TwitterAPI = {
    "username": lambda i, r, c: [i.username],
    "password": lambda i, r, c: [i.password],
    "tweet_id": lambda i, r, c: list(i.tweets),
    "username_to_follow": lambda i, r, c: ["charlie", "dana", "erin"],
    "username_to_unfollow": lambda i, r, c: list(i.following_list),
    "mentioned_usernames": lambda i, r, c: [["@alice"], ["@bob", "@charlie"]],
    "tags": lambda i, r, c: [["#update"], ["#news", "#team"]],
    "mentions": lambda i, r, c: [["@alice"]],
    "keyword": lambda i, r, c: [w for t in i.tweets.values() for w in t["content"].split() if len(w) > 4][:10],
    "get_user_tweets.username": lambda i, r, c: sorted({t["username"] for t in i.tweets.values()}),
    "get_user_stats.username": lambda i, r, c: sorted({t["username"] for t in i.tweets.values()}),
}

TicketAPI = {
    "ticket_id": lambda i, r, c: [t["id"] for t in i.ticket_queue],
    "username": lambda i, r, c: ["admin", "support_agent"],
    "password": lambda i, r, c: ["secure123"],
    "status": lambda i, r, c: sorted({t.get("status", "Open") for t in i.ticket_queue}) or ["Open"],
    "updates": lambda i, r, c: [{"priority": 3}, {"status": "In Progress"}, {"description": "Updated details."}],
    "priority": lambda i, r, c: [1, 3, 5],
}

TradingBot = {
    "symbol": lambda i, r, c: list(i.stocks),
    "stock": lambda i, r, c: [s for s in i.stocks if s not in i.watch_list],
    "remove_stock_from_watchlist.symbol": lambda i, r, c: list(i.watch_list),
    "stocks": lambda i, r, c: [r.sample(list(i.stocks), k=min(3, len(i.stocks)))],
    "order_id": lambda i, r, c: [k for k in i.orders if isinstance(k, int)],
    "cancel_order.order_id": lambda i, r, c: [
        k for k, o in i.orders.items() if isinstance(o, dict) and o.get("status") in ("Open", "Pending")
    ],
    "name": lambda i, r, c: ["Apple", "Google", "Tesla", "Microsoft", "Nvidia", "Amazon"],
    "sector": lambda i, r, c: ["Technology", "Automobile"],
    "order_type": lambda i, r, c: ["Buy", "Sell"],
    "price": lambda i, r, c: [i.stocks[c["symbol"]]["price"]] if c.get("symbol") in i.stocks else [100.0],
    "amount": lambda i, r, c: [5, 10, 20],
    "place_order.amount": lambda i, r, c: [1, 2, 5],
    "min_price": lambda i, r, c: [50.0, 100.0],
    "max_price": lambda i, r, c: [500.0, 1000.0],
    "threshold": lambda i, r, c: [0.5, 1.0, 2.0],
    "username": lambda i, r, c: ["trader"],
    "password": lambda i, r, c: ["pass123"],
    "start_date": lambda i, r, c: ["2024-01-01"],
    "end_date": lambda i, r, c: ["2024-12-31"],
}


@cache
def _flight_routes() -> tuple[tuple[str, str], ...]:
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.travel_booking import TravelAPI

    probe = TravelAPI()
    probe._load_scenario({})
    airports = probe.list_all_airports()
    routes = []
    for a in airports:
        for b in airports:
            try:
                probe.get_flight_cost(travel_from=a, travel_to=b, travel_date="2024-11-15", travel_class="economy")
                routes.append((a, b))
            except Exception:
                pass
    return tuple(routes)


def _card(i, c):
    return [k for k, v in i.credit_card_list.items() if isinstance(v, dict) and "balance" in v] or list(
        i.credit_card_list
    )


TravelAPI = {
    "travel_from": lambda i, r, c: sorted({a for a, _ in _flight_routes()}),
    "travel_to": lambda i, r, c: [b for a, b in _flight_routes() if a == c.get("travel_from")],
    "travel_date": lambda i, r, c: ["2024-11-15", "2024-12-01", "2025-01-10"],
    "travel_class": lambda i, r, c: ["economy", "business", "first"],
    "card_id": lambda i, r, c: _card(i, c),
    "booking_id": lambda i, r, c: list(i.booking_record),
    "location": lambda i, r, c: CITIES,
    "grant_type": lambda i, r, c: ["read_write"],
    "client_id": lambda i, r, c: ["client_520"],
    "client_secret": lambda i, r, c: ["secret_1l3"],
    "refresh_token": lambda i, r, c: ["refresh_xyz"],
    "user_first_name": lambda i, r, c: [i.user_first_name or "Michael"],
    "user_last_name": lambda i, r, c: [i.user_last_name or "Thompson"],
    "first_name": lambda i, r, c: [i.user_first_name or "Michael"],
    "last_name": lambda i, r, c: [i.user_last_name or "Thompson"],
    "date_of_birth": lambda i, r, c: ["1990-05-14"],
    "passport_number": lambda i, r, c: ["US8394721"],
    "card_number": lambda i, r, c: ["4012888888881881", "5105105105105100"],
    "expiration_date": lambda i, r, c: ["12/2028"],
    "cardholder_name": lambda i, r, c: ["Michael Thompson"],
    "card_verification_number": lambda i, r, c: [123, 456],
    "insurance_type": lambda i, r, c: ["comprehensive", "travel"],
    "insurance_cost": lambda i, r, c: [50.0, 120.0],
    "budget_limit": lambda i, r, c: [1000.0, 5000.0],
    "base_currency": lambda i, r, c: ["USD", "EUR", "GBP"],
    "target_currency": lambda i, r, c: [x for x in ["USD", "RMB", "EUR", "JPY", "GBP"] if x != c.get("base_currency")],
    "value": lambda i, r, c: [100.0, 250.0],
    "access_token": lambda i, r, c: [i.access_token] if i.access_token else [],
}


@cache
def _zip_pairs() -> tuple[tuple[str, str], ...]:
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.vehicle_control import VehicleControlAPI

    probe = VehicleControlAPI()
    probe._load_scenario({})
    zips = [probe.get_zipcode_based_on_city(c)["zipcode"] for c in CITIES]
    pairs = []
    for a in zips:
        for b in zips:
            out = copy.deepcopy(probe).estimate_distance(cityA=a, cityB=b)
            if "error" not in out:
                pairs.append((a, b))
    return tuple(pairs)


VehicleControlAPI = {
    "city": lambda i, r, c: CITIES[:12],
    "cityA": lambda i, r, c: sorted({a for a, _ in _zip_pairs()}),
    "cityB": lambda i, r, c: [b for a, b in _zip_pairs() if a == c.get("cityA")],
    "door": lambda i, r, c: (
        [[d] for d in ["driver", "passenger", "rear_left", "rear_right"]]
        + [["driver", "passenger", "rear_left", "rear_right"]]
    ),
    "pedalPosition": lambda i, r, c: [1.0, 0.5],
    "fuelAmount": lambda i, r, c: [5.0, 10.0, 20.0],
    "speed": lambda i, r, c: [40.0, 55.0, 65.0],
    "distanceToNextVehicle": lambda i, r, c: [50.0, 100.0],
    "temperature": lambda i, r, c: [20.0, 22.0, 25.0],
    "destination": lambda i, r, c: ["2107 Channing Way, Berkeley, CA", "123 Main St, San Francisco, CA"],
    "distance": lambda i, r, c: [50.0, 300.0],
    "messages": lambda i, r, c: [["Check tire pressure"], ["Engine started", "Doors locked"]],
}

HINTS = {
    "GorillaFileSystem": GorillaFileSystem,
    "MathAPI": MathAPI,
    "MessageAPI": MessageAPI,
    "TwitterAPI": TwitterAPI,
    "TicketAPI": TicketAPI,
    "TradingBot": TradingBot,
    "TravelAPI": TravelAPI,
    "VehicleControlAPI": VehicleControlAPI,
}

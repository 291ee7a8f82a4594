#!/usr/bin/env bash
# Regenerate src/composer_replication/data/fixture_replay_pairs.jsonl: the replay-channel demo
# dataset, produced by the real pipeline (ingest -> two local teachers -> agreement -> pairs)
# from the public fixture logs in ../shared/fixtures. Takes ~10 minutes on a 2-core CPU.
set -euo pipefail
work=$(mktemp -d)
python examples/pick_states.py ../shared/fixtures 24 4000 "$work/states.jsonl"
composer-replication serve --model embedded:smollm2-135m-instruct --port 8101 --served-model-name smol > "$work/s1.log" 2>&1 &
s1=$!
composer-replication serve --model embedded:smollm2-135m-instruct --port 8102 --served-model-name smol > "$work/s2.log" 2>&1 &
s2=$!
trap 'kill $s1 $s2' EXIT
for port in 8101 8102; do
  until curl -sf "http://127.0.0.1:$port/v1/models" > /dev/null; do sleep 2; done
done
composer-replication replay "$work/states.jsonl" --teachers configs/teachers/local.yaml --budget-usd 0.05 --out "$work/replay.db"
composer-replication pairs "$work/replay.db" --out "$work/pairs"
cp "$work/pairs/pairs.jsonl" src/composer_replication/data/fixture_replay_pairs.jsonl
echo "wrote $(wc -l < src/composer_replication/data/fixture_replay_pairs.jsonl) pairs"

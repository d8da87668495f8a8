"""The Kafka image's entry point: server.properties from the environment
(the apache/kafka image's convention: KAFKA_A_B__C=v is a.b_c=v), storage
formatted with CLUSTER_ID on first start, then the broker in the foreground.
Standard library only: the image has Debian's Python, not tokenmill."""

import os
import subprocess
import sys

# JVM settings, not broker properties.
NOT_PROPERTIES = {"KAFKA_HEAP_OPTS", "KAFKA_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS"}
CONFIG = "/opt/kafka/config/server.properties"


def properties(env):
    lines = []
    for name, value in sorted(env.items()):
        if not name.startswith("KAFKA_") or name in NOT_PROPERTIES:
            continue
        key = name[len("KAFKA_"):].lower().replace("__", "\0").replace("_", ".").replace("\0", "_")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def java(main, *args, jvm=("-Xmx256m",)):
    return ["java", *jvm, "-XX:+UseG1GC",
            "-Dlog4j2.configurationFile=/opt/kafka/log4j2.properties",
            "-cp", "/opt/kafka/libs/*", main, *args]


def main():
    cluster = os.environ.get("CLUSTER_ID")
    if not cluster:
        sys.exit("kafka-entrypoint: CLUSTER_ID is not set (a 22-character base64 id)")
    os.makedirs(os.path.dirname(CONFIG), exist_ok=True)
    with open(CONFIG, "w") as config:
        config.write(properties(os.environ))
    subprocess.run(java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster}",
                        "--ignore-formatted", "-c", CONFIG), check=True)
    heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xmx768m -Xms128m").split()
    command = java("kafka.Kafka", CONFIG, jvm=heap)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()

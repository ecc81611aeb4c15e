#!/bin/sh
# The topic tool at the path of the official image, for health checks: kafka-topics.sh --bootstrap-server … --list
exec java -Xmx128m -XX:TieredStopAtLevel=1 -cp '/opt/kafka/libs/*' -Dlog4j2.level=error \
  org.apache.kafka.tools.TopicCommand "$@"
